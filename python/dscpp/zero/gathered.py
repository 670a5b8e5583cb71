"""GatheredParameters: DeepSpeed's context for reading — or, with modifier_rank, changing — whole parameters that
ZeRO-3 keeps sharded. Inside it each parameter's .data is its whole value (assembled from the ranks' shards:
collective, so every rank enters with the same parameters, outside a forward); on exit the modifier rank's values
are broadcast and written into every rank's master and shards, and the parameters hold no memory again. Under
stages 0-2 the parameters are whole already; with modifier_rank the engine's master copy is updated from them too.
Parameters built by zero.Init and not yet given to initialize are gathered from their units the same way (on exit
cut down again, with the modifier rank's values). Other parameters are left alone, as DeepSpeed leaves unpartitioned
ones."""
import weakref

import torch
import torch.distributed as dist

from . import init as zero_init

# Which engine trains each parameter, by id (set by DeepSpeedEngine; our metadata stays off the tensors). Weak
# references to the engines, checked against the engine's own parameters, so a stale id of a dead parameter never
# matches. Not a WeakKeyDictionary: its lookups compare tensors with ==, which reads a released parameter's memory.
_owners = {}


def register(engine, named_parameters):
    ref = weakref.ref(engine)
    for _, p in named_parameters:
        _owners[id(p)] = ref


def _owner(p):
    ref = _owners.get(id(p))
    engine = ref() if ref is not None else None
    return engine if engine is not None and engine._params_by_id.get(id(p)) is p else None


class GatheredParameters:
    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self._params = [p for p in params if p is not None]
        self._modifier_rank = modifier_rank
        self._enabled = enabled
        self._engine = None
        self._saved = []
        self._units = []  # zero.Init units this context gathered

    def __enter__(self):
        if not self._enabled:
            return None
        engines = {id(e): e for e in map(_owner, self._params) if e is not None}
        if len(engines) > 1:
            raise ValueError("GatheredParameters: the parameters belong to different engines; gather them apart")
        if not engines:
            self._gather_built_units()
            return None
        self._engine = next(iter(engines.values()))
        self._params = [p for p in self._params if _owner(p) is self._engine]
        with torch.no_grad():
            for p in self._params:
                self._saved.append(p.data)
                p.data = self._engine._engine.whole_parameter(p)
        return None

    def _gather_built_units(self):
        seen = set()
        for p in self._params:
            record = zero_init.record_of(p)
            if record is None or id(record.unit) in seen or record.unit.whole:
                continue  # not zero.Init's, or whole already (read since): left as it is
            seen.add(id(record.unit))
            record.init.gather(record.unit)
            self._units.append(record)

    def __exit__(self, *exc):
        if self._units:
            units, self._units = self._units, []
            modifier = self._modifier_rank if self._modifier_rank is not None and exc[0] is None else -1
            for record in units:
                record.init.repartition(record.unit, modifier)
            return False
        if self._engine is None:
            return False
        try:
            if self._modifier_rank is not None and exc[0] is None:
                values = {}
                for p in self._params:
                    if dist.is_initialized() and dist.get_world_size() > 1:
                        dist.broadcast(p.data, self._modifier_rank)
                    values[self._engine._param_names[id(p)]] = p.data
                self._engine._engine.set_parameters(values)
        finally:
            with torch.no_grad():
                for p, data in zip(self._params, self._saved):
                    p.data = data
        return False
