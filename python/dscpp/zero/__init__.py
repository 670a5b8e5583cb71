"""dscpp.zero: ZeRO-3 from Python — the hooks that gather each module's parameters around its forward (hooks.py),
GatheredParameters (gathered.py) and partitioned construction, Init (init.py)."""
from . import hooks  # noqa: F401
from .gathered import GatheredParameters  # noqa: F401
from .init import Init  # noqa: F401
