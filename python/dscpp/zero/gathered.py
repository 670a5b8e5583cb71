"""GatheredParameters: DeepSpeed's context for reading — or, with modifier_rank, changing — whole parameters that
ZeRO-3 keeps sharded. Inside it each parameter's .data is its whole value (assembled from the ranks' shards:
collective, so every rank enters with the same parameters, outside a forward); on exit the modifier rank's values
are broadcast and written into every rank's master and shards — of the parameters it changed, the others keep their
master bit for bit — and the parameters hold no memory again. Under stages 0-2 the parameters are whole already;
with modifier_rank the engine's master copy is updated from the changed ones too. The parameters may belong to
several engines (a policy and its reference model), each gathered and written apart.
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
        self._gathered = []  # [(engine, its parameters here, their data before, copies at entry)]
        self._units = []  # zero.Init units this context gathered

    def __enter__(self):
        if not self._enabled:
            return None
        # The parameters of each engine (TRL's SyncRefModelCallback gathers a policy's and its reference's together),
        # in the order given, so that every rank issues the same gathers.
        by_engine, unowned = {}, []
        for p in self._params:
            engine = _owner(p)
            if engine is None:
                unowned.append(p)
            else:
                by_engine.setdefault(id(engine), (engine, []))[1].append(p)
        self._gather_built_units(unowned)
        modifies = self._modifier_rank is not None and _rank() == self._modifier_rank
        with torch.no_grad():
            for engine, params in by_engine.values():
                saved = [p.data for p in params]
                for p in params:
                    p.data = engine._engine.whole_parameter(p)
                # Which parameters the modifier rank changes is found on exit against their values now: under ZeRO-3
                # gathered again from the untouched shards; under stages 0-2 the parameters are the engine's own
                # tensors, so the modifier rank keeps a copy.
                copies = [p.data.clone() for p in params] if modifies and engine.zero_optimization_stage() < 3 else None
                self._gathered.append((engine, params, saved, copies))
        return None

    def _gather_built_units(self, params):
        seen = set()
        for p in params:
            record = zero_init.record_of(p)
            if record is None or id(record.unit) in seen or record.unit.whole:
                continue  # not zero.Init's, or whole already (read since): left as it is
            seen.add(id(record.unit))
            record.init.gather(record.unit)
            self._units.append(record)

    def __exit__(self, *exc):
        modifier = self._modifier_rank if self._modifier_rank is not None and exc[0] is None else None
        units, self._units = self._units, []
        for record in units:
            record.init.repartition(record.unit, -1 if modifier is None else modifier)
        gathered, self._gathered = self._gathered, []
        for engine, params, saved, copies in gathered:
            try:
                if modifier is not None:
                    _write_changed(engine, params, copies, modifier)
            finally:
                with torch.no_grad():
                    for p, data in zip(params, saved):
                        p.data = data
        return False


def _rank():
    return dist.get_rank() if dist.is_initialized() else 0


def _write_changed(engine, params, copies, modifier):
    """The modifier rank's values of the parameters it changed become every rank's, in the engine's master and shards.
    Only those: one left as it was keeps the master bit for bit (under bf16/fp16 a write of its 16-bit value would
    round the fp32 master)."""
    many = dist.is_initialized() and dist.get_world_size() > 1
    with torch.no_grad():
        if engine.zero_optimization_stage() == 3:  # the values before, gathered again (every rank takes part)
            before = [engine._engine.whole_parameter(p) for p in params]
        else:
            before = copies if copies is not None else [None] * len(params)  # kept by the modifier rank alone
        changed = torch.tensor([bool(b is not None and not torch.equal(p.data, b)) for p, b in zip(params, before)],
                               dtype=torch.uint8)
        if many:
            dist.broadcast(changed, modifier)
        values = {}
        for p, flag in zip(params, changed.tolist()):
            if flag:
                if many:
                    dist.broadcast(p.data, modifier)
                values[engine._param_names[id(p)]] = p.data
        if values:
            engine._engine.set_parameters(values)
