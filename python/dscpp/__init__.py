"""deepspeed.cpp's Python front end: DeepSpeed's public API over the C++ engine.

    import dscpp as deepspeed
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config.json")
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

Everything heavy — partitioning, buckets, collectives, the optimizer, offload, checkpoints — runs in the C++ engine
(dscpp._C); this package only translates between it and PyTorch.
"""
import torch  # noqa: F401  (loads libtorch and torch's Python bindings before the extension that uses them)

from ._C import CheckpointError, CommError, ConfigError
from .comm import init_distributed
from .config import add_config_arguments
from .engine import DeepSpeedEngine
from .initialize import initialize
from . import checkpointing, moe, ops, utils, zero  # noqa: F401  (dscpp.checkpointing.checkpoint, dscpp.moe.layer.MoE, …)

__version__ = "0.1.0"

__all__ = [
    "initialize",
    "init_distributed",
    "add_config_arguments",
    "DeepSpeedEngine",
    "ConfigError",
    "CheckpointError",
    "CommError",
]
