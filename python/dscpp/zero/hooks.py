"""ZeRO-3 on any nn.Module: which parameters are gathered together (the units) and the hooks that tell the C++ stage
when each unit's forward starts and ends.

Units follow DeepSpeed's granularity: each module that owns parameters directly is one unit of those parameters;
a module marked with dscpp.utils.set_z3_leaf_modules is one unit of all its parameters, and nothing under it is
hooked. A forward pre-hook enters the unit (the stage gathers it), a forward hook leaves it (the stage hooks the
outputs' gradients to gather it again before the unit's backward, then releases it). A parameter read outside its
own module's forward — a tied weight another module uses, one the parent's forward reads — is fetched on access,
as DeepSpeed's ZeROOrderedDict does: each module's _parameters becomes a dict that tells the stage about every read.
"""
import collections
import copy
import functools

import torch

from . import parameter


def output_tensors(outputs):
    """The tensors in a forward's outputs (nested tuples, lists, dicts, HF ModelOutputs)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (tuple, list)):
        return [t for item in outputs for t in output_tensors(item)]
    return []


def gather_units(model):
    """[(name, module, parameters)] in module order, DeepSpeed's granularity (see the module docstring)."""
    units, leaves = [], []
    for name, module in model.named_modules():
        if any(name.startswith(leaf + ".") or leaf == "" for leaf in leaves):
            continue  # inside a leaf: its parameters are the leaf's
        if getattr(module, "_z3_leaf", False):
            leaves.append(name)
            params = list(module.parameters())
        else:
            params = [p for p in module._parameters.values() if p is not None]
        if params:  # frozen ones too: ZeRO-3 partitions them with their module's
            units.append((name or "(the model)", module, params))
    return units


class _FetchingParameters(collections.OrderedDict):
    """A module's _parameters that tell the stage about each read (nn.Module.__getattr__ reads them with [])."""

    def __init__(self, items, fetch):
        super().__init__(items)
        self._fetch = fetch

    def __getitem__(self, key):
        param = super().__getitem__(key)
        if param is not None:
            self._fetch(param)
        return param

    def __deepcopy__(self, memo):
        """copy.deepcopy of a module (DeepSpeed's MoE deep-copies its expert): each parameter is read, so fetched
        whole, and copied whole into a plain dict; the copies are parameters of their own, which the engine
        partitions at initialize like any other."""
        return collections.OrderedDict((key, copy.deepcopy(self[key], memo)) for key in self)


def _enter(engine, unit, module, inputs):
    engine.enter_unit(unit)


def _leave(engine, unit, module, inputs, outputs):
    engine.leave_unit(unit, output_tensors(outputs))


def unit_hooks(engine, units):
    """The forward pre-hook and hook of each of `units` (gather_units' list, in the order the engine was built with)
    for `engine` (dscpp._C.Engine); returns their handles (ParameterOffload holds them)."""
    handles = []
    for index, (_, module, _) in enumerate(units):
        handles.append(module.register_forward_pre_hook(functools.partial(_enter, engine, index)))
        handles.append(module.register_forward_hook(functools.partial(_leave, engine, index)))
    return handles


def _no_external_parameters():
    """DeepSpeed's module.ds_external_parameters(): the parameters registered with register_external_parameter.
    None here: a read from outside the owning module is fetched on access (_FetchingParameters)."""
    return iter(())


def install_parameter_reads(model, engine):
    """Every module's _parameters becomes a _FetchingParameters for `engine`, and its parameters ZeroParameter; each
    module shows DeepSpeed's ds_external_parameters() (TRL reads it on the model)."""
    for module in model.modules():
        # From items(): building from the mapping would read each parameter through the old dict's __getitem__.
        module._parameters = _FetchingParameters(module._parameters.items(), engine.fetch_param)
        parameter.adopt(dict.values(module._parameters))  # DeepSpeed's ds_status on each (parameter.py)
        module.ds_external_parameters = _no_external_parameters


def uninstall_parameter_reads(model):
    """Undoes install_parameter_reads (engine.destroy): every module gets a plain _parameters again."""
    for module in model.modules():
        if isinstance(module._parameters, _FetchingParameters):
            module._parameters = dict(dict.items(module._parameters))  # nn.Module keeps a plain dict
        parameter.release(module._parameters.values())
        module.__dict__.pop("ds_external_parameters", None)
