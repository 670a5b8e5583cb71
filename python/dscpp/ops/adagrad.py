"""DeepSpeedCPUAdagrad: DeepSpeed's CPU Adagrad (ZeRO-Offload with Adagrad; Hugging Face Accelerate swaps a torch
Adagrad for it when the optimizer is offloaded) with DeepSpeed's signature. Its arithmetic is torch.optim.Adagrad's
with no lr decay and an accumulator starting at 0, which is what DeepSpeed's computes: L2 weight decay added to the
gradient, the squared gradients summed, the step lr · g / (sqrt(sum) + eps). Passed to dscpp.initialize it becomes
the config's Adagrad with the same settings, run by the engine's flat Adagrad."""
import torch


class DeepSpeedCPUAdagrad(torch.optim.Adagrad):
    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
        if amsgrad:
            raise RuntimeError("DeepSpeedCPUAdagrad does not support amsgrad (as DeepSpeed's)")
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPUAdagrad: fp32_optimizer_states=False is not supported: the states are fp32")
        super().__init__(model_params, lr=lr, lr_decay=0, weight_decay=weight_decay, initial_accumulator_value=0,
                         eps=eps, foreach=False)
