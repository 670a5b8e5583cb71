"""dscpp.runtime: the `deepspeed.runtime` names scripts import (LR scheduler classes, RepeatingLoader,
see_memory_usage)."""
from . import dataloader, lr_schedules, utils  # noqa: F401
