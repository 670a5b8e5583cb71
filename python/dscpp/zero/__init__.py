"""dscpp.zero: ZeRO-3 from Python — the hooks that gather each module's parameters around its forward (hooks.py)
and GatheredParameters (gathered.py)."""
from . import hooks  # noqa: F401
from .gathered import GatheredParameters  # noqa: F401
