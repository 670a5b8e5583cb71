"""`deepspeed.runtime.zero`, where DeepSpeed defines ZeRO-3's Python side: the same objects as dscpp.zero (Hugging
Face Accelerate imports GatheredParameters from here), and partition_parameters (Transformers patches it)."""
from dscpp.zero import (GatheredParameters, Init, register_external_parameter,  # noqa: F401
                        unregister_external_parameter)

from . import partition_parameters  # noqa: F401
