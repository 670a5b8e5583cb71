"""dscpp.checkpointing.checkpoint: DeepSpeed's activation checkpointing, run by the C++ engine with the config's
activation_checkpointing section (partition_activations, cpu_checkpointing, contiguous_memory_optimization,
number_checkpoints, synchronize_checkpoint_boundary, profile). `function`'s forward runs without keeping its
activations; only its input is kept, and during backward the function runs again with the same random draws.

    x = dscpp.checkpointing.checkpoint(block, x)      # inside the model's forward, run by engine(...)
"""
import torch

_active = []  # the engines whose forward is running, innermost last (DeepSpeedEngine.forward pushes and pops)


def checkpoint(function, *args):
    """`function(*args)` with activation checkpointing. One argument is a tensor (the input that is kept); the
    others are passed as they are; the result is one tensor."""
    if not _active:
        raise RuntimeError("dscpp.checkpointing.checkpoint: call it inside the model's forward run by engine(...) "
                           "(it uses that engine's activation_checkpointing config)")
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if len(tensors) != 1:
        raise NotImplementedError(f"dscpp.checkpointing.checkpoint: {len(tensors)} tensor arguments; a function of "
                                  "exactly one tensor is supported for now (close over the others)")
    at = tensors[0]

    def block(x):
        out = function(*args[:at], x, *args[at + 1:])
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"dscpp.checkpointing.checkpoint: the function returned {type(out).__name__}; one "
                            "tensor is supported for now")
        return out

    return _active[-1]._engine.checkpoint(block, args[at])


def is_configured():
    """DeepSpeed's: whether checkpointing is set up — here, whether an engine's forward is running."""
    return bool(_active)
