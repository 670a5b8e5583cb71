"""register_external_parameter / unregister_external_parameter: DeepSpeed's way of telling ZeRO-3 that a module's
forward reads a parameter another module owns (a tied weight, a shared projection), so it is gathered for that
forward too. Here every read of a partitioned parameter outside its own module's forward is fetched on access
(hooks.py: each module's _parameters tells the stage about every read), so there is nothing to register: both check
their arguments, as DeepSpeed's do, and change nothing. Hugging Face's audio models call the first at construction."""
import torch


def _check(module, parameter, name):
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{name}: module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(parameter, torch.nn.Parameter):
        raise TypeError(f"{name}: parameter must be a torch.nn.Parameter, got {type(parameter).__name__}")


def register_external_parameter(module, parameter):
    _check(module, parameter, "register_external_parameter")


def unregister_external_parameter(module, parameter):
    _check(module, parameter, "unregister_external_parameter")
