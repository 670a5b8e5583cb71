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

from ._torch_version import BUILT_AGAINST as _BUILT_AGAINST

# The extension runs only on the torch it was compiled against: refuse another before loading it.
if torch.__version__ != _BUILT_AGAINST:
    raise ImportError(f"dscpp was built against torch {_BUILT_AGAINST}, but this environment has torch "
                      f"{torch.__version__}; install torch=={_BUILT_AGAINST.split('+')[0]} (the wheel built for the "
                      f"same CUDA) or rebuild dscpp in this environment (scripts/setup.sh)")

from ._C import CheckpointError, CommError, ConfigError  # noqa: E402
from .comm import init_distributed
from .config import add_config_arguments
from .engine import DeepSpeedEngine
from .inference import init_inference
from .initialize import initialize
# dscpp.comm.get_rank, dscpp.moe.layer.MoE, dscpp.runtime.lr_schedules.WarmupLR, ... without importing each
from . import accelerator, checkpoint, checkpointing, comm, inference, module_inject  # noqa: F401
from . import moe, ops, runtime, utils, zero  # noqa: F401
from .utils import OnDevice  # noqa: E402  (deepspeed.OnDevice)

__version__ = "0.1.0"

__all__ = [
    "initialize",
    "init_inference",
    "init_distributed",
    "add_config_arguments",
    "DeepSpeedEngine",
    "OnDevice",
    "ConfigError",
    "CheckpointError",
    "CommError",
]
