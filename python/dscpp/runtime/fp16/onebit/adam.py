"""OnebitAdam: DeepSpeed's 1-bit Adam (deepspeed/runtime/fp16/onebit/adam.py of DeepSpeed 0.19.6, the last release
that ships it) with its signature, as a torch.optim.Optimizer that holds the settings. Passed to dscpp.initialize it
becomes the config's "OneBitAdam" with the same settings, run by the engine (src/onebit/onebit_adam.cpp): its
momentum is averaged over the data-parallel ranks, which only the engine can do, so it does not step on its own.

DeepSpeed's OnebitAdam takes bias_correction, eps_inside_sqrt and max_grad_norm and ignores them: bias_correction is
accepted either way (no bias correction is applied, as DeepSpeed's), the other two are refused when they ask for an
effect, as the config refuses them. DeepSpeed's per-group exp_avg_mask and non_freeze are refused too."""
import torch


def check_ignored_settings(name, deepspeed, eps_inside_sqrt, max_grad_norm, comm_backend_name):
    """What the 1-bit optimizers take and cannot use here: the engine (the engine's to give), settings DeepSpeed's
    ignore (refused when they ask for an effect), and transports other than c10d's."""
    if deepspeed is not None:
        raise ValueError(f"{name}: deepspeed= is the engine's to give; pass the optimizer to "
                         "dscpp.initialize(optimizer=...) or name it in the config's optimizer.type")
    if eps_inside_sqrt or max_grad_norm:
        raise ValueError(f"{name}: eps_inside_sqrt and max_grad_norm have no effect in DeepSpeed's {name}; leave "
                         "them at False and 0 (clip with the config's gradient_clipping)")
    if comm_backend_name not in ("nccl", "compressed"):
        raise ValueError(f"{name}: comm_backend_name {comm_backend_name!r}: deepspeed.cpp communicates over c10d "
                         "(NCCL on GPUs, Gloo on CPUs); use 'nccl' or 'compressed'")


def check_group_keys(optimizer):
    """DeepSpeed's 1-bit optimizers read exp_avg_mask and non_freeze from a parameter group; the engine has neither."""
    for i, group in enumerate(optimizer.param_groups):
        for key in ("exp_avg_mask", "non_freeze"):
            if key in group:
                raise ValueError(f"{type(optimizer).__name__}: parameter group {i}'s {key} is not supported yet by "
                                 "deepspeed.cpp")


class OnebitAdam(torch.optim.Optimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, freeze_step=100000, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, eps_inside_sqrt=False, weight_decay=0., max_grad_norm=0., amsgrad=False, cuda_aware=False,
                 comm_backend_name="nccl"):
        if amsgrad:
            raise RuntimeError("1-bit Adam does not support the AMSGrad variant.")
        check_ignored_settings("OnebitAdam", deepspeed, eps_inside_sqrt, max_grad_norm, comm_backend_name)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.freeze_step = int(freeze_step)
        self.cuda_aware = bool(cuda_aware)
        self.comm_backend_name = comm_backend_name

    def config_section(self):
        """The config's "optimizer" section this optimizer stands for."""
        check_group_keys(self)
        group = self.param_groups[0]
        return {"type": "OneBitAdam",
                "params": {"lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"],
                           "weight_decay": group["weight_decay"], "freeze_step": self.freeze_step,
                           "cuda_aware": self.cuda_aware, "comm_backend_name": self.comm_backend_name}}

    def step(self, closure=None):
        raise RuntimeError("OnebitAdam runs inside the engine (its momentum is averaged over the data-parallel "
                           "ranks): pass it to dscpp.initialize(optimizer=...) and call engine.step()")
