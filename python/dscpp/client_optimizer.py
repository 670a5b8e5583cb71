"""A client optimizer (initialize's `optimizer=torch.optim.AdamW(...)`) as the config's "optimizer" section.

The engine steps its own flat optimizer over each rank's partition, so a torch optimizer is not run: its type and
hyperparameters are read and handed to the engine as the section DeepSpeed would have built it from. Types whose
arithmetic the engine has are translated; any other is an error naming the type.
"""
import torch

_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")


def _hyperparameters(group, keys):
    out = {}
    for key in keys:
        value = group[key]
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _check_flags(name, group):
    for flag in ("maximize", "capturable", "differentiable"):
        if group.get(flag, False):
            raise ValueError(f"dscpp.initialize: optimizer {name} with {flag}=True is not supported")


def optimizer_section(optimizer):
    """The "optimizer" config section for a torch.optim optimizer; TypeError for a type the engine cannot run."""
    from .ops.adam import DeepSpeedCPUAdam

    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if not groups:
        raise ValueError(f"dscpp.initialize: optimizer {name} has no parameter groups")
    # One flat partition, one set of hyperparameters: groups may split the parameters, not give them different
    # settings.
    settings = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    for i, s in enumerate(settings[1:], start=1):
        if s != settings[0]:
            differ = sorted(k for k in set(s) | set(settings[0]) if s.get(k) != settings[0].get(k))
            raise ValueError(f"dscpp.initialize: optimizer {name}'s parameter group {i} differs from group 0 in "
                             f"{', '.join(differ)}; per-group hyperparameters are not supported yet: use one "
                             "setting for all parameters")
    group = groups[0]
    _check_flags(name, group)
    if isinstance(optimizer, DeepSpeedCPUAdam):
        params = _hyperparameters(group, ("lr", "betas", "eps", "weight_decay", "amsgrad"))
        params.update(adam_w_mode=optimizer.adam_w_mode, bias_correction=group["bias_correction"])
        return {"type": "Adam", "params": params}
    if type(optimizer) is torch.optim.AdamW:
        return {"type": "AdamW", "params": _hyperparameters(group, _ADAM_KEYS)}
    if type(optimizer) is torch.optim.Adam:
        # torch's Adam adds weight decay to the gradient (L2); DeepSpeed's "Adam" decouples it unless told not to.
        return {"type": "Adam", "params": dict(_hyperparameters(group, _ADAM_KEYS), adam_w_mode=False)}
    if type(optimizer) is torch.optim.SGD:
        return {"type": "SGD",
                "params": _hyperparameters(group, ("lr", "momentum", "dampening", "weight_decay", "nesterov"))}
    if type(optimizer) is torch.optim.Adagrad:
        return {"type": "Adagrad",
                "params": _hyperparameters(group, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value",
                                                   "eps"))}
    raise TypeError(f"dscpp.initialize: optimizer {type(optimizer).__module__}.{name} cannot be taken: the engine "
                    "runs its own optimizer and knows torch.optim.Adam, AdamW, SGD, Adagrad and "
                    "dscpp.ops.adam.DeepSpeedCPUAdam; pass one of those, or an \"optimizer\" section in the config")


def optimizer_parameters(optimizer):
    """The parameters a client optimizer was given, each once."""
    seen, out = set(), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out
