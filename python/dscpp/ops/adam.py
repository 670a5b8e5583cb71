"""DeepSpeedCPUAdam: the engine's SIMD CPU Adam (ZeRO-Offload's optimizer) as a torch.optim.Optimizer, with
DeepSpeed's signature. Each step updates every fp32 CPU parameter in one fused pass (AVX-512, AVX2 or scalar,
chosen for this CPU). Passed to dscpp.initialize it becomes the config's Adam with the same settings."""
import torch

from .. import _C
from ._step import params_with_grads, run_closure


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise RuntimeError("DeepSpeedCPUAdam does not support amsgrad (as DeepSpeed's); use torch.optim.Adam")
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPUAdam: fp32_optimizer_states=False is not supported: the states are fp32")
        if lr < 0 or eps <= 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"DeepSpeedCPUAdam: invalid lr={lr}, eps={eps}, weight_decay={weight_decay} or "
                             f"betas={betas}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, amsgrad=False)
        super().__init__(model_params, defaults)
        self.adam_w_mode = adamw_mode
        self.simd_path = _C.simd_path()

    @torch.no_grad()
    def step(self, closure=None):
        loss = run_closure(closure)
        for group, p in params_with_grads(self, "DeepSpeedCPUAdam"):
            beta1, beta2 = group["betas"]
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["step"] += 1
            _C.cpu_adam_step(p.data, p.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"],
                             lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                             weight_decay=group["weight_decay"], decoupled=self.adam_w_mode,
                             bias_correction=group["bias_correction"], step=state["step"])
        return loss
