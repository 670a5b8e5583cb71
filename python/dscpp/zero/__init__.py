"""dscpp.zero: ZeRO-3 from Python — the hooks that gather each module's parameters around its forward (hooks.py),
GatheredParameters (gathered.py), partitioned construction, Init (init.py), and register_external_parameter
(external.py: nothing to register, reads are fetched on access)."""
from . import hooks  # noqa: F401
from .gathered import GatheredParameters  # noqa: F401
from .init import Init  # noqa: F401
from .external import register_external_parameter, unregister_external_parameter  # noqa: F401
