"""OnebitLamb: DeepSpeed's 1-bit LAMB (deepspeed/runtime/fp16/onebit/lamb.py of DeepSpeed 0.19.6) with its signature,
as a torch.optim.Optimizer that holds the settings: passed to dscpp.initialize it becomes the config's "OneBitLamb",
run by the engine (src/onebit/onebit_lamb.cpp), as OnebitAdam (adam.py) is."""
import torch

from .adam import check_group_keys, check_ignored_settings


class OnebitLamb(torch.optim.Optimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, freeze_step=100000, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, eps_inside_sqrt=False, weight_decay=0., max_grad_norm=0., max_coeff=10.0, min_coeff=0.01,
                 amsgrad=False, cuda_aware=False, comm_backend_name="nccl", coeff_beta=0.9, factor_max=4.0,
                 factor_min=0.5, factor_threshold=0.1):
        if amsgrad:
            raise RuntimeError("1-bit Lamb does not support the AMSGrad variant.")
        check_ignored_settings("OnebitLamb", deepspeed, eps_inside_sqrt, max_grad_norm, comm_backend_name)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      max_coeff=max_coeff, min_coeff=min_coeff))
        self.freeze_step = int(freeze_step)
        self.cuda_aware = bool(cuda_aware)
        self.comm_backend_name = comm_backend_name
        self.coeff_beta = float(coeff_beta)
        self.factor_max = float(factor_max)
        self.factor_min = float(factor_min)
        self.factor_threshold = float(factor_threshold)

    def config_section(self):
        """The config's "optimizer" section this optimizer stands for."""
        check_group_keys(self)
        group = self.param_groups[0]
        return {"type": "OneBitLamb",
                "params": {"lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"],
                           "weight_decay": group["weight_decay"], "max_coeff": group["max_coeff"],
                           "min_coeff": group["min_coeff"], "freeze_step": self.freeze_step,
                           "coeff_beta": self.coeff_beta, "factor_max": self.factor_max,
                           "factor_min": self.factor_min, "factor_threshold": self.factor_threshold,
                           "cuda_aware": self.cuda_aware, "comm_backend_name": self.comm_backend_name}}

    def step(self, closure=None):
        raise RuntimeError("OnebitLamb runs inside the engine (its momentum is averaged over the data-parallel "
                           "ranks): pass it to dscpp.initialize(optimizer=...) and call engine.step()")
