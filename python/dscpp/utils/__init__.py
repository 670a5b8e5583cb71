"""dscpp.utils: DeepSpeed's helpers for ZeRO-3 units, its logger, RepeatingLoader and OnDevice."""
import logging

import torch

from ..runtime.dataloader import RepeatingLoader  # noqa: F401  (deepspeed.utils.RepeatingLoader)
from .init_on_device import OnDevice  # noqa: F401  (deepspeed.utils.OnDevice, deepspeed.OnDevice)

# deepspeed.utils.logger: scripts and libraries (Accelerate) log through it and set its level.
logger = logging.getLogger("dscpp")


def set_z3_leaf_modules(model, leaf_module_classes):
    """Makes every submodule of `model` whose type is one of `leaf_module_classes` (classes, or their names) a
    single ZeRO-3 unit: its parameters are gathered and released together around its forward, and nothing inside it
    is hooked — as DeepSpeed's, e.g. for a mixture-of-experts block whose experts run in data-dependent order. Call
    it before dscpp.initialize. Returns the modules marked."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"set_z3_leaf_modules: model must be a torch.nn.Module, got {type(model).__name__}")
    classes = tuple(c for c in leaf_module_classes if isinstance(c, type))
    names = {c for c in leaf_module_classes if isinstance(c, str)}
    if len(classes) + len(names) != len(list(leaf_module_classes)):
        raise TypeError("set_z3_leaf_modules: leaf_module_classes must be module classes or class names")
    marked = []
    for module in model.modules():
        if isinstance(module, classes) or type(module).__name__ in names:
            module._z3_leaf = True
            marked.append(module)
    if not marked:
        raise ValueError(f"set_z3_leaf_modules: no submodule of {type(model).__name__} is one of "
                         f"{[getattr(c, '__name__', c) for c in leaf_module_classes]}")
    return marked


def unset_z3_leaf_modules(model, leaf_module_classes):
    """Undoes set_z3_leaf_modules for those classes; returns the modules unmarked."""
    classes = tuple(c for c in leaf_module_classes if isinstance(c, type))
    unmarked = []
    for module in model.modules():
        if z3_leaf_module(module) and (isinstance(module, classes) or type(module).__name__ in leaf_module_classes):
            module._z3_leaf = False
            unmarked.append(module)
    return unmarked


def z3_leaf_module(module):
    """Whether `module` is a ZeRO-3 leaf."""
    return getattr(module, "_z3_leaf", False)
