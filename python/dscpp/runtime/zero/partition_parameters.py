"""`deepspeed.runtime.zero.partition_parameters`: the module in which DeepSpeed defines zero.Init. Its names that
callers reach are here, with our objects. Transformers' `from_pretrained` under ZeRO-3 swaps
`zero_wrapper_for_fp_tensor_constructor` for one that leaves `torch.arange`'s dtype alone (its
prevent_arange_dtype_change): DeepSpeed's zero.Init replaces torch's tensor constructors with wrappers that cast to
the half dtype and move to the device, and builds them with this function. Our zero.Init (dscpp/zero/init.py)
replaces no constructor — tensors are made as the module's code asks, then each parameter is partitioned — so this
wrapper, kept for that swap, returns the constructor unchanged and nothing here calls it."""
import torch

from dscpp.accelerator import get_accelerator  # noqa: F401  (read by Transformers' wrapper)
from dscpp.zero import (GatheredParameters, Init, register_external_parameter,  # noqa: F401
                        unregister_external_parameter)
from dscpp.zero.parameter import ZeroParamStatus  # noqa: F401  (TRL compares a parameter's ds_status with it)

# torch's own constructor, which Transformers' wrapper compares against to recognise arange.
_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    """`fn` itself: our zero.Init neither casts nor moves what constructors make (see the module docstring)."""
    return fn
