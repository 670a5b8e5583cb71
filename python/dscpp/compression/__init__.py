"""DeepSpeed Compression (ZeroQuant, XTC): init_compression / redundancy_clean (compress.py), the compression-aware
layers (basic_layer.py) and the schedule the engine steps (scheduler.py). docs/compression.md."""
from . import basic_layer, compress, helper, scheduler  # noqa: F401
from .compress import init_compression, redundancy_clean  # noqa: F401
