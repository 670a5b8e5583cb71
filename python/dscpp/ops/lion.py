"""DeepSpeedCPULion: DeepSpeed's CPU Lion (ZeRO-Offload with Lion; Hugging Face Accelerate swaps a 32-bit
bitsandbytes Lion for it when the optimizer is offloaded) with DeepSpeed's signature, as a torch.optim.Optimizer.
Each step, per parameter: decoupled weight decay p·(1 − lr·wd), then p − lr·sign(β1·m + (1 − β1)·g), then the
momentum m ← β2·m + (1 − β2)·g. Passed to dscpp.initialize it becomes the config's Lion with the same settings, run
by the engine's flat Lion (src/optim/flat_lion.cpp: the same order of operations)."""
import torch

from ._step import params_with_grads, run_closure


class DeepSpeedCPULion(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True):
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPULion: fp32_optimizer_states=False is not supported: the states are fp32")
        if lr < 0 or weight_decay < 0 or not (0 <= betas[0] <= 1 and 0 <= betas[1] <= 1):
            raise ValueError(f"DeepSpeedCPULion: invalid lr={lr}, weight_decay={weight_decay} or betas={betas}")
        super().__init__(model_params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = run_closure(closure)
        for group, p in params_with_grads(self, "DeepSpeedCPULion"):
            beta1, beta2 = group["betas"]
            lr, weight_decay = group["lr"], group["weight_decay"]
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            m = state["exp_avg"]
            if weight_decay != 0:
                p.mul_(1.0 - lr * weight_decay)
            p.add_(m.mul(beta1).add_(p.grad, alpha=1.0 - beta1).sign_(), alpha=-lr)
            m.mul_(beta2).add_(p.grad, alpha=1.0 - beta2)
        return loss
