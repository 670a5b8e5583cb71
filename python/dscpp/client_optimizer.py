"""A client optimizer (initialize's `optimizer=torch.optim.AdamW(...)`) as the config's "optimizer" section.

The engine steps its own flat optimizer over each rank's partition, so a torch optimizer is not run: its type and
hyperparameters are read and handed to the engine as the section DeepSpeed would have built it from. Types whose
arithmetic the engine has are translated; any other is an error naming the type.

Parameter groups (a client optimizer's, or initialize's model_parameters as dicts) may give their parameters a
weight decay and an lr of their own — "no decay for biases and norms", a smaller lr for the lower layers — which the
engine applies to those parameters' ranges of its flat partition. Any other setting must be the same in every group.
"""
import torch

_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")
# What may differ between groups: the settings a group has of its own, and DeepSpeed's bookkeeping ("name", and "moe"
# marking an expert group: dscpp.moe.utils.split_params_into_different_moe_groups_for_optimizer).
_PER_GROUP = ("params", "weight_decay", "lr", "initial_lr", "name", "moe")


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
    from .ops.adagrad import DeepSpeedCPUAdagrad
    from .ops.adam import DeepSpeedCPUAdam
    from .ops.lamb import FusedLamb
    from .ops.lion import DeepSpeedCPULion
    from .runtime.fp16.onebit import OnebitAdam, OnebitLamb, ZeroOneAdam

    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if not groups:
        raise ValueError(f"dscpp.initialize: optimizer {name} has no parameter groups")
    # One flat partition, one set of hyperparameters but the weight decay and lr, which the engine applies per range
    # (torch's schedulers add initial_lr to each group: it follows the group's lr).
    settings = [{k: v for k, v in g.items() if k not in _PER_GROUP} for g in groups]
    for i, s in enumerate(settings[1:], start=1):
        if s != settings[0]:
            differ = sorted(k for k in set(s) | set(settings[0]) if s.get(k) != settings[0].get(k))
            raise ValueError(f"dscpp.initialize: optimizer {name}'s parameter group {i} differs from group 0 in "
                             f"{', '.join(differ)}; only weight_decay and lr may differ between groups: use one "
                             "setting of the others for all parameters")
    group = groups[0]
    _check_flags(name, group)
    if isinstance(optimizer, (OnebitAdam, ZeroOneAdam, OnebitLamb, FusedLamb)):
        return optimizer.config_section()
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
    if isinstance(optimizer, DeepSpeedCPULion):
        return {"type": "Lion", "params": _hyperparameters(group, ("lr", "betas", "weight_decay"))}
    if type(optimizer) is torch.optim.Adagrad or isinstance(optimizer, DeepSpeedCPUAdagrad):
        return {"type": "Adagrad",
                "params": _hyperparameters(group, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value",
                                                   "eps"))}
    raise TypeError(f"dscpp.initialize: optimizer {type(optimizer).__module__}.{name} cannot be taken: the engine "
                    "runs its own optimizer and knows torch.optim.Adam, AdamW, SGD, Adagrad and DeepSpeed's "
                    "DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion and FusedLamb (dscpp.ops) and "
                    "OnebitAdam, ZeroOneAdam, OnebitLamb (dscpp.runtime.fp16.onebit); pass one of those, or "
                    "an \"optimizer\" section in the config")


def _number(group, i, key):
    value = group[key]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"dscpp.initialize: parameter group {i}'s {key} must be a number >= 0, got {value!r}")
    return float(value)


def _group_params(group):
    params = group["params"]
    return [params] if isinstance(params, torch.Tensor) else list(params)


def engine_groups(groups, config_params=None):
    """The engine's parameter groups, [(parameters, weight_decay or None, lr or None)], one per group: of a client
    optimizer's param_groups (every setting given), or of model_parameters dicts, whose keys but weight_decay and lr
    must equal the config's optimizer.params (`config_params`; a setting the config does not give is refused, as its
    default is the engine's to choose). [] for a client optimizer of one group: the optimizer section is its
    settings."""
    groups = list(groups)
    if config_params is None and len(groups) < 2:
        return []
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            raise ValueError(f"dscpp.initialize: model_parameters mixes parameter groups (dicts) with "
                             f"{type(group).__name__} at {i}; give all as dicts, or all as tensors")
        if config_params is not None:
            for key, value in group.items():
                if key in _PER_GROUP:
                    continue
                value = list(value) if isinstance(value, tuple) else value
                if key not in config_params or config_params[key] != value:
                    given = f"is {config_params[key]!r}" if key in config_params else "does not set it"
                    raise ValueError(f"dscpp.initialize: model_parameters group {i} sets {key}={value!r} and the "
                                     f"config's optimizer.params {given}; groups may differ only in weight_decay "
                                     "and lr")
        out.append((_group_params(group),
                    _number(group, i, "weight_decay") if "weight_decay" in group else None,
                    _number(group, i, "lr") if "lr" in group else None))
    return out


def optimizer_parameters(optimizer):
    """The parameters a client optimizer was given, each once."""
    seen, out = set(), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out
