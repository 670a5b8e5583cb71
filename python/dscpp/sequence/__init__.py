"""dscpp.sequence: DeepSpeed-Ulysses sequence parallelism (deepspeed.sequence) — dscpp.sequence.layer.DistributedAttention."""
from . import layer  # noqa: F401
