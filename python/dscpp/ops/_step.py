"""What DeepSpeed's CPU optimizers share around their arithmetic: the closure, and the parameters a step updates."""
import torch


def run_closure(closure):
    """A step's closure, run with gradients enabled (torch.optim's protocol); its loss, or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def params_with_grads(optimizer, name):
    """(group, parameter) for each parameter that has a gradient, in order, as torch's optimizers step them; a sparse
    gradient is refused naming `name` (the optimizer's class)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{name} does not support sparse gradients")
            yield group, p
