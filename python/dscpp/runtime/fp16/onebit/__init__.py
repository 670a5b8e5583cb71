"""DeepSpeed's 1-bit optimizers by their deepspeed.runtime.fp16.onebit names."""
from .adam import OnebitAdam
from .lamb import OnebitLamb
from .zoadam import ZeroOneAdam

__all__ = ["OnebitAdam", "OnebitLamb", "ZeroOneAdam"]
