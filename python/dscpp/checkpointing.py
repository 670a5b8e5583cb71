"""dscpp.checkpointing.checkpoint: DeepSpeed's activation checkpointing, run by the C++ engine with the config's
activation_checkpointing section (partition_activations, cpu_checkpointing, contiguous_memory_optimization,
number_checkpoints, synchronize_checkpoint_boundary, profile). `function`'s forward runs without keeping its
activations; only its inputs are kept, and during backward the function runs again with the same random draws.

    x = dscpp.checkpointing.checkpoint(block, x)                  # inside the model's forward, run by engine(...)
    x, aux = dscpp.checkpointing.checkpoint(layer, x, mask, 0.1)  # several arguments and results
"""
import torch

_active = []  # the engines whose forward is running, innermost last (DeepSpeedEngine.forward pushes and pops)


def checkpoint(function, *args):
    """`function(*args)` with activation checkpointing, as DeepSpeed's. The tensor arguments are kept for the
    recompute (floating-point ones in the form the config asks for: partitioned, on the CPU, in contiguous slots),
    the other arguments are passed again as they are. `function` returns a tensor, or a tuple or list whose tensors
    get gradients; a list comes back as a tuple, as DeepSpeed's does."""
    if not _active:
        raise RuntimeError("dscpp.checkpointing.checkpoint: call it inside the model's forward run by engine(...) "
                           "(it uses that engine's activation_checkpointing config)")
    at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if not at:
        raise TypeError("dscpp.checkpointing.checkpoint: no tensor among the arguments; a checkpointed function "
                        "needs at least one tensor input (it is what the recompute starts from)")
    # The forward's result as a tuple with its tensors' places left empty (None: the result was one tensor). Only
    # the non-tensor items are held: the tensors come back from the engine, with the recompute as their history.
    layout = []

    def block(tensors):
        full = list(args)
        for i, t in zip(at, tensors):
            full[i] = t
        out = function(*full)
        if isinstance(out, torch.Tensor):
            shape, flat = None, [out]
        elif isinstance(out, (tuple, list)):
            places = [i for i, o in enumerate(out) if isinstance(o, torch.Tensor)]
            shape = ([None if i in places else o for i, o in enumerate(out)], places)
            flat = [out[i] for i in places]
        else:
            raise TypeError(f"dscpp.checkpointing.checkpoint: the function returned {type(out).__name__}; a "
                            "checkpointed function returns a tensor or a tuple or list of values")
        if not layout:
            layout.append(shape)
        return flat

    results = _active[-1]._engine.checkpoint(block, [args[i] for i in at])
    if layout[0] is None:
        return results[0]
    items, places = layout[0]
    items = list(items)
    for place, result in zip(places, results):
        items[place] = result
    return tuple(items)


def is_configured():
    """DeepSpeed's: whether checkpointing is set up — here, whether an engine's forward is running."""
    return bool(_active)
