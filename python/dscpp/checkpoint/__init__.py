"""dscpp.checkpoint: deepspeed.checkpoint's helpers for scripts that save state themselves."""
from . import utils  # noqa: F401
