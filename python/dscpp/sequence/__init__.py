"""dscpp.sequence: DeepSpeed-Ulysses sequence parallelism (deepspeed.sequence) — dscpp.sequence.layer.DistributedAttention
— and the tiled loss of long sequences (dscpp.sequence.tiled_loss.tiled_cross_entropy)."""
from . import layer, tiled_loss  # noqa: F401
