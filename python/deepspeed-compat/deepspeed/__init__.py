"""`import deepspeed` answering with deepspeed.cpp (the dscpp package).

Installed by python/deepspeed-compat in place of real DeepSpeed. This module is dscpp's top level under another name,
and every submodule `deepspeed.X` is `dscpp.X` itself — the same module object, so `deepspeed.comm is dscpp.comm` and
a class is the same class under both names. A submodule dscpp does not have is a ModuleNotFoundError naming it.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys

import dscpp as _dscpp


class _Same(importlib.abc.Loader):
    """Loads `deepspeed.X` as the already imported `dscpp.X`."""

    def __init__(self, module):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        # The import system has just written this name's spec over the module's; it stays dscpp's module.
        module.__spec__ = self._spec


class _DscppFinder(importlib.abc.MetaPathFinder):
    """Finds `deepspeed.X` as `dscpp.X` (importing it), so the two names share one module."""

    def find_spec(self, name, path, target=None):
        if not name.startswith(__name__ + "."):
            return None
        try:
            module = importlib.import_module("dscpp." + name[len(__name__) + 1:])
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.startswith("dscpp"):
                raise ModuleNotFoundError(f"No module named {name!r}: deepspeed.cpp (dscpp) has no {e.name!r}",
                                          name=name) from None
            raise
        return importlib.machinery.ModuleSpec(name, _Same(module), origin=getattr(module, "__file__", None),
                                              is_package=hasattr(module, "__path__"))


sys.meta_path.insert(0, _DscppFinder())
__path__ = []  # a package whose submodules the finder above supplies

# dscpp's names (initialize, init_distributed, comm, zero, runtime, ...) are this module's, and the submodules dscpp
# imported already answer under this name too, before anything asks.
for _name, _value in vars(_dscpp).items():
    if not _name.startswith("__"):
        globals()[_name] = _value
for _name, _module in list(sys.modules.items()):
    if _name.startswith("dscpp."):
        sys.modules.setdefault(__name__ + _name[len("dscpp"):], _module)

# What Accelerate, Transformers and TRL read: the DeepSpeed release this behaves as (this distribution's version).
__version__ = importlib.metadata.version("deepspeed")
__version_major__, __version_minor__, __version_patch__ = (int(x) for x in __version__.split(".")[:3])
__git_hash__ = None
__git_branch__ = None
__dscpp_version__ = _dscpp.__version__
