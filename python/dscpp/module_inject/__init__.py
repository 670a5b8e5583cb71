"""dscpp.module_inject, as deepspeed.module_inject: AutoTP's planner (auto_tp) and its tensor-parallel layers
(layers)."""
from .auto_tp import plan as auto_tp_plan  # noqa: F401
from .layers import LinearAllreduce, LinearLayer, VocabParallelEmbedding  # noqa: F401
