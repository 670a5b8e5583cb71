"""zero.Init: DeepSpeed's partitioned construction, so that no rank ever holds the whole model.

    with dscpp.zero.Init(config_dict_or_path="ds_config.json"):
        model = MyModel()                                   # each module cut down as its __init__ returns
    engine, *_ = dscpp.initialize(model=model, config="ds_config.json")

Inside the context every nn.Module subclass's __init__ is wrapped: when a module's (outermost) __init__ returns, its
own parameters — DeepSpeed's unit — are cut down by the C++ engine (PartitionedInit): every rank takes rank 0's
values, keeps its 1/N shard in the config's compute dtype and frees the rest. A rank holds at most its shards so
far and the module being built. Until initialize takes them the parameters are 0-element tensors, as DeepSpeed's are,
so a stray read finds an empty tensor rather than freed memory.

Inside the context, reading a partitioned parameter by name (module.weight, the way init code does) gathers its
unit whole again; it is cut down again, with rank 0's values, when the next module's __init__ returns or, under
module.apply(fn) (HF's post_init), as soon as fn has run on its module — so initialising weights after construction
never holds more than one subtree whole. After the context the parameters read as empty tensors until initialize, as
DeepSpeed's do; GatheredParameters reads or changes them. Every rank must build the model with the same code, reading
the same parameters in the same order: each gather is a collective.

A unit regrouped after construction — set_z3_leaf_modules, a parameter reassigned to another module, frozen, or a
persistence threshold that now keeps it whole — is gathered at initialize when its new group is built.
"""
import functools
import json
import os
import weakref

import torch
import torch.distributed as dist

from .. import _C
from ..comm import engine_comm_arguments, init_distributed
from ..config import dict_or_path, load_json, without_auto
from .hooks import _FetchingParameters

# Each partitioned parameter, by id: (the parameter, its unit, the PartitionedInit that cut it). The unit's C++ side
# holds the parameter, so its id stays its own while the entry lives; entries go when initialize takes the unit or
# the module that owns it is collected.
_records = {}
_keys_by_module = {}  # id(module) → the ids in _records of the parameters cut down when it was built
_active = None  # the Init being entered; contexts do not nest (an inner one does nothing)


class _Record:
    __slots__ = ("unit", "init")

    def __init__(self, unit, init):
        self.unit = unit
        self.init = init


def fetch(param):
    """Inside the context: makes `param` whole, if it was partitioned, until the next partition point."""
    if _active is None:
        return
    record = record_of(param)
    if record is not None and not record.unit.whole:
        record.init.gather(record.unit)
        _active._fetched.append(record)


def record_of(param):
    """The partitioned unit holding `param`, or None."""
    entry = _records.get(id(param))
    return entry[1] if entry is not None and entry[0] is param else None


def units_of(model):
    """The partitioned units holding `model`'s parameters, each once, in parameter order."""
    units, seen = [], set()
    for p in model.parameters():
        record = record_of(p)
        if record is not None and id(record.unit) not in seen:
            seen.add(id(record.unit))
            units.append(record.unit)
    return units


def take_units(model):
    """For initialize: units_of(model), which go to the engine (it adopts their shards). Their records are dropped,
    and so are those of units of the model's modules whose parameters the model no longer holds (reassigned)."""
    units = units_of(model)
    for module in model.modules():
        _forget(_keys_by_module.pop(id(module), ()))
    return units


def _forget(keys):
    for key in keys:
        _records.pop(key, None)


def _module_collected(module_id):
    _forget(_keys_by_module.pop(module_id, ()))


def _all_subclasses(cls):
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def _wrapped_init(init):
    """`init` (a module class's own __init__), partitioning the module when the outermost __init__ returns."""
    building = {}  # id(module) → depth of its __init__ calls through this wrapper (super().__init__ chains)

    @functools.wraps(init)
    def wrapper(module, *args, **kwargs):
        key = id(module)
        depth = building.get(key, 0)
        building[key] = depth + 1
        try:
            init(module, *args, **kwargs)
        finally:
            if depth:
                building[key] = depth
            else:
                del building[key]
        # Built when no wrapper is still running for this module (a subclass's __init__ above this one would be).
        if depth == 0 and _active is not None and not _still_building(module):
            _active._built(module)

    wrapper._dscpp_original = init
    wrapper._dscpp_building = building
    return wrapper


class Init:
    """DeepSpeed's zero.Init (see the module docstring). `config_dict_or_path` (or `config`) gives the compute
    dtype and zero_optimization.stage3_param_persistence_threshold and must be stage 3 — pass the config given to
    initialize; without one, `dtype` (default torch's default dtype) and DeepSpeed's default threshold are used.
    `module`: an already built module to partition now. Model-parallel groups, quantized weights, NVMe or pinned
    remote devices are not supported (NotImplementedError); with zero_optimization.offload_param the engine moves
    the shards at initialize. mem_efficient_linear needs nothing here: ZeRO-3 already gathers a unit again for its
    backward instead of saving the gathered weight."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 zero_param_parallel_group=None, zero_quantized_weights=False,
                 zero_quantized_nontrainable_weights=False, sequence_data_parallel_group=None, param_swapper=None):
        unsupported = dict(mpu=mpu, zero_param_parallel_group=zero_param_parallel_group,
                           sequence_data_parallel_group=sequence_data_parallel_group, param_swapper=param_swapper)
        for name, value in unsupported.items():
            if value is not None:
                raise NotImplementedError(f"dscpp.zero.Init: {name} is not supported")
        if zero_quantized_weights:
            raise NotImplementedError("dscpp.zero.Init: zero_quantized_weights=True is read from the config here: set "
                                      "zero_optimization.zero_quantized_weights (the engine's all-gathers follow it)")
        if zero_quantized_nontrainable_weights:
            raise NotImplementedError("dscpp.zero.Init: zero_quantized_nontrainable_weights=True is read from the "
                                      "config here: set zero_optimization.zero_quantized_nontrainable_weights (the "
                                      "engine stores the frozen shards at initialize)")
        if remote_device not in (None, "cpu", "none"):
            raise NotImplementedError(f"dscpp.zero.Init: remote_device={remote_device!r} is not supported (the "
                                      "shards stay on the parameters' device; zero_optimization.offload_param moves "
                                      "them at initialize)")
        if pin_memory:
            raise NotImplementedError("dscpp.zero.Init: pin_memory=True is not supported (shards stay where built)")
        if data_parallel_group is not None and (not dist.is_initialized() or
                                                data_parallel_group is not dist.group.WORLD):
            raise NotImplementedError("dscpp.zero.Init: only the default process group is supported")
        if config is not None and config_dict_or_path is not None:
            raise ValueError("dscpp.zero.Init: both config and config_dict_or_path were given; pass one")
        self._config = config_dict_or_path if config_dict_or_path is not None else config
        self._dtype = dtype
        self._enabled = enabled
        self._cpp = None
        self._fetched = []      # records gathered by a read since the last partition point
        self._patched = []      # (class, original __init__) restored on exit
        self._owner = False     # this context patched (not an inner one)
        if enabled and module is not None:
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"dscpp.zero.Init: module must be a torch.nn.Module, got {type(module).__name__}")
            self._start()
            try:
                for m in _post_order(module):
                    self._built(m)
            finally:
                self._repartition_fetched()

    # ---- the context ----------------------------------------------------------------------------------------------

    def __enter__(self):
        global _active
        if not self._enabled or _active is not None:
            return self
        self._start()
        for cls in _all_subclasses(torch.nn.Module):
            self._wrap(cls)
        self._patched_subclass_hook = "__init_subclass__" not in torch.nn.Module.__dict__
        if self._patched_subclass_hook:
            torch.nn.Module.__init_subclass__ = classmethod(_on_new_subclass)
        self._original_apply = torch.nn.Module.apply
        torch.nn.Module.apply = _apply_then_repartition
        _active = self
        self._owner = True
        return self

    def __exit__(self, *exc):
        global _active
        if not self._owner:
            return False
        _active = None
        self._owner = False
        torch.nn.Module.apply = self._original_apply
        if self._patched_subclass_hook:
            del torch.nn.Module.__init_subclass__
        for cls, original in self._patched:
            cls.__init__ = original
        self._patched = []
        if exc[0] is None:
            self._repartition_fetched()
        return False

    # ---- inside ---------------------------------------------------------------------------------------------------

    def _start(self):
        if self._cpp is not None:
            return
        if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            init_distributed()
        config, is_path = self._config_text()
        self._cpp = _C.create_partitioned_init(config=config, config_is_path=is_path,
                                               **engine_comm_arguments("zero_init"))
        built_in = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16}[self._cpp.dtype]
        if self._dtype is not None and self._dtype != built_in:
            raise ValueError(f"dscpp.zero.Init: dtype={self._dtype} but the config computes in {built_in}; the shards "
                             "are kept in the compute dtype (leave dtype out)")

    def _config_text(self):
        config = self._config
        if config is None:
            dtype = self._dtype or torch.get_default_dtype()
            section = {torch.float16: {"fp16": {"enabled": True}}, torch.bfloat16: {"bf16": {"enabled": True}},
                       torch.float32: {}}.get(dtype)
            if section is None:
                raise ValueError(f"dscpp.zero.Init: dtype {dtype} is not one ZeRO trains in (float32, float16, "
                                 "bfloat16)")
            config = dict(train_micro_batch_size_per_gpu=1, zero_optimization={"stage": 3}, **section)
        as_dict, path = dict_or_path(config, "dscpp.zero.Init", "config_dict_or_path")
        if path is not None:
            as_dict = load_json(path)
        # Only what partitioning reads — zero_optimization and the compute dtype — with the keys still "auto"
        # dropped, as DeepSpeed's config model drops them: Transformers builds a ZeRO-3 model under its Trainer
        # config before the keys that depend on the model (bucket sizes, the schedule's step counts) are filled. The
        # rest (batch, optimizer, scheduler) is initialize's to check, once filled; one micro-batch stands in here.
        kept = {key: as_dict[key] for key in ("zero_optimization", "fp16", "bf16", "bfloat16") if key in as_dict}
        return json.dumps(dict(without_auto(kept), train_micro_batch_size_per_gpu=1)), False

    def _wrap(self, cls):
        init = cls.__dict__.get("__init__")
        if init is None or hasattr(init, "_dscpp_original"):
            return
        cls.__init__ = _wrapped_init(init)
        self._patched.append((cls, init))

    def _built(self, module):
        """`module` is built: repartition what construction read, then cut down its own parameters."""
        self._repartition_fetched()
        params = [(name, p) for name, p in module._parameters.items()
                  if p is not None and record_of(p) is None]
        if params:
            unit = self._cpp.partition(params)  # collective; None when every parameter stays whole
            if unit is not None:
                record = _Record(unit, self._cpp)
                keys = []
                for p in unit.params:
                    _records[id(p)] = (p, record)
                    keys.append(id(p))
                if id(module) not in _keys_by_module:
                    weakref.finalize(module, _module_collected, id(module))
                _keys_by_module.setdefault(id(module), []).extend(keys)
        if not isinstance(module._parameters, _FetchingParameters):
            module._parameters = _FetchingParameters(module._parameters.items(), fetch)

    def _repartition_fetched(self):
        fetched, self._fetched = self._fetched, []
        for record in fetched:
            record.init.repartition(record.unit, 0)  # rank 0's values, as when the unit was first cut down


def _still_building(module):
    """Whether the wrapped __init__ of a class in `module`'s MRO is still running for it."""
    for cls in type(module).__mro__:
        building = getattr(cls.__dict__.get("__init__"), "_dscpp_building", None)
        if building is not None and building.get(id(module), 0) > 0:
            return True
    return False


def _on_new_subclass(cls, **kwargs):
    """nn.Module.__init_subclass__ while an Init is active: classes defined inside the context are wrapped too."""
    if _active is not None:
        _active._wrap(cls)


def _apply_then_repartition(module, fn):
    """nn.Module.apply inside the context: each module's parameters that fn read are cut down again once fn has run
    on that module (its children's already were, by their own apply)."""
    for child in module.children():
        child.apply(fn)
    fn(module)
    if _active is not None:
        _active._repartition_fetched()
    return module


def _post_order(module):
    for child in module.children():
        yield from _post_order(child)
    yield module
