"""dscpp.moe.utils: DeepSpeed's helpers to tell expert parameters apart and to give them optimizer groups of their
own (deepspeed.moe.utils). The engine needs no such groups — it finds the MoE layers' experts itself and averages
and partitions them over their expert-data-parallel group — but a DeepSpeed script builds them, and the engine
takes them as parameter groups like any other (their "name" and "moe" keys are bookkeeping)."""
from collections import defaultdict

import torch


def is_moe_param(param):
    """Whether `param` is an expert's (Experts marks them allreduce=False)."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_shared_and_expert_params(params):
    """(shared, expert) lists of `params`."""
    shared, expert = [], []
    for p in params:
        (expert if is_moe_param(p) else shared).append(p)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(group):
    """(shared grads, expert grads) of the parameters in `group` that have a gradient."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=178956971):
    """DeepSpeed's: each parameter group (a dict with "params" and "name", or a list or tuple of them) loses its
    expert parameters to new groups, one per expert group name, copying the group's settings, with "name" the
    expert group's and "moe": True; with max_group_size, an expert group over that many elements is split into
    several (and an empty one dropped). Returns a tuple of the groups, the given ones first."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: param_groups must be a dict, a list "
                         f"or a tuple of dicts, got {type(param_groups).__name__}")
    for i, group in enumerate(param_groups):
        if not isinstance(group, dict) or "params" not in group or "name" not in group:
            raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: parameter group {i} must be a "
                             "dict with 'params' and 'name' (DeepSpeed's groups are named)")
        if isinstance(group["params"], torch.Tensor):
            group["params"] = [group["params"]]
        else:
            group["params"] = list(group["params"])

    expert_names = []  # every expert group name, in first-seen order
    for group in param_groups:
        for p in group["params"]:
            if is_moe_param(p) and p.group_name not in expert_names:
                expert_names.append(p.group_name)
    moe_groups = defaultdict(dict)  # group name → expert group name → new group
    for group in param_groups:
        for name in expert_names:
            moe_groups[group["name"]][name] = {**group, "name": name, "moe": True, "params": []}
    for group in param_groups:
        shared = []
        for p in group["params"]:
            if is_moe_param(p):
                moe_groups[group["name"]][p.group_name]["params"].append(p)
            else:
                shared.append(p)
        group["params"] = shared

    for by_expert_name in moe_groups.values():
        for moe_group in by_expert_name.values():
            if max_group_size is None:
                param_groups.append(moe_group)
                continue
            pieces, size = [[]], 0
            for p in moe_group["params"]:
                if pieces[-1] and size + p.numel() > max_group_size:
                    pieces.append([])
                    size = 0
                pieces[-1].append(p)
                size += p.numel()
            for piece in pieces:
                if piece:
                    param_groups.append({**moe_group, "params": piece})
    return tuple(param_groups)
