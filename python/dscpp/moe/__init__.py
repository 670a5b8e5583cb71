"""dscpp.moe: DeepSpeed's Mixture of Experts — the layer (dscpp.moe.layer.MoE) and the optimizer-group helpers
(dscpp.moe.utils)."""
from . import layer, utils  # noqa: F401
