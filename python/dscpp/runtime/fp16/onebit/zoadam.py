"""ZeroOneAdam: DeepSpeed's 0/1 Adam (deepspeed/runtime/fp16/onebit/zoadam.py of DeepSpeed 0.19.6) with its signature,
as a torch.optim.Optimizer that holds the settings: passed to dscpp.initialize it becomes the config's "ZeroOneAdam",
run by the engine (src/onebit/zero_one_adam.cpp), as OnebitAdam (adam.py) is."""
import torch

from .adam import check_group_keys, check_ignored_settings


class ZeroOneAdam(torch.optim.Optimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0., max_grad_norm=0., var_freeze_step=100000,
                 var_update_scaler=16, local_step_scaler=32678, local_step_clipper=16, amsgrad=False,
                 cuda_aware=False, comm_backend_name="nccl"):
        if amsgrad:
            raise RuntimeError("0/1 Adam does not support the AMSGrad variant.")
        check_ignored_settings("ZeroOneAdam", deepspeed, eps_inside_sqrt, max_grad_norm, comm_backend_name)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.var_freeze_step = int(var_freeze_step)
        self.var_update_scaler = int(var_update_scaler)
        self.local_step_scaler = int(local_step_scaler)
        self.local_step_clipper = int(local_step_clipper)
        self.cuda_aware = bool(cuda_aware)
        self.comm_backend_name = comm_backend_name

    def config_section(self):
        """The config's "optimizer" section this optimizer stands for."""
        check_group_keys(self)
        group = self.param_groups[0]
        return {"type": "ZeroOneAdam",
                "params": {"lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"],
                           "weight_decay": group["weight_decay"], "var_freeze_step": self.var_freeze_step,
                           "var_update_scaler": self.var_update_scaler, "local_step_scaler": self.local_step_scaler,
                           "local_step_clipper": self.local_step_clipper, "cuda_aware": self.cuda_aware,
                           "comm_backend_name": self.comm_backend_name}}

    def step(self, closure=None):
        raise RuntimeError("ZeroOneAdam runs inside the engine (it averages over the data-parallel ranks): pass it to "
                           "dscpp.initialize(optimizer=...) and call engine.step()")
