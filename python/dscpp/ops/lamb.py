"""FusedLamb: DeepSpeed's LAMB (deepspeed.ops.lamb.FusedLamb) with its signature, as a torch.optim.Optimizer that holds
the settings. Passed to dscpp.initialize it becomes the config's "Lamb" with the same settings, run by the engine's
flat Lamb (src/optim/flat_lamb.cpp), which takes each tensor's norms across the ranks holding its pieces; DeepSpeed's
is a CUDA kernel, and neither steps outside an engine."""
import torch


class FusedLamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False,
                 weight_decay=0., max_grad_norm=0., max_coeff=10.0, min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        if max_grad_norm:
            raise ValueError("FusedLamb: max_grad_norm clips only inside DeepSpeed's fused fp16 optimizer; leave it at "
                             "0 and clip with the config's gradient_clipping")
        super().__init__(params, dict(lr=lr, bias_correction=bool(bias_correction), betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, max_coeff=max_coeff, min_coeff=min_coeff))
        self.eps_inside_sqrt = bool(eps_inside_sqrt)

    def config_section(self):
        """The config's "optimizer" section this optimizer stands for."""
        group = self.param_groups[0]
        return {"type": "Lamb",
                "params": {"lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"],
                           "weight_decay": group["weight_decay"], "bias_correction": group["bias_correction"],
                           "max_coeff": group["max_coeff"], "min_coeff": group["min_coeff"],
                           "eps_inside_sqrt": self.eps_inside_sqrt}}

    def step(self, closure=None):
        raise RuntimeError("FusedLamb runs inside the engine (each tensor's trust ratio needs the norms of its pieces "
                           "on every rank): pass it to dscpp.initialize(optimizer=...) and call engine.step()")
