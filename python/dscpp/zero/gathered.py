"""GatheredParameters: DeepSpeed's context for reading — or, with modifier_rank, changing — whole parameters that
ZeRO-3 keeps sharded. Inside it each parameter's .data is its whole value (assembled from the ranks' shards:
collective, so every rank enters with the same parameters, outside a forward). On exit the modifier rank's values
of the parameters it changed are broadcast and written into every rank's master and shards — the others keep their
master bit for bit — and the parameters hold no memory again. modifier_rank is a rank of the engine's data-parallel
group, as DeepSpeed's is of the parameter's partition group (the world without an mpu). Under stages 0-2 the
parameters are whole already; with modifier_rank the engine's master copy is updated from the changed ones too.
The parameters may belong to several engines (a policy and its reference model), each gathered and written apart,
through the engine's own methods (holds, whole_parameter, write_parameters) and its data-parallel group.
Parameters built by zero.Init and not yet given to initialize are gathered from their units the same way (on exit
cut down again, with the modifier rank's values). Other parameters are left alone, as DeepSpeed leaves unpartitioned
ones."""
import weakref

import torch
import torch.distributed as dist

from . import init as zero_init

# The live engines (set by DeepSpeedEngine). Which one trains a parameter is each engine's to say (engine.holds):
# nothing is kept per parameter here, and a dead engine drops out by itself.
_engines = weakref.WeakSet()


def register(engine):
    _engines.add(engine)


def owner(p):
    """The live engine that trains `p`, or None."""
    return next((engine for engine in list(_engines) if engine.holds(p)), None)


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
            engine = owner(p)
            if engine is None:
                unowned.append(p)
            else:
                by_engine.setdefault(id(engine), (engine, []))[1].append(p)
        self._gather_built_units(unowned)
        with torch.no_grad():
            for engine, params in by_engine.values():
                group_rank, group_size = _place_in(engine.data_parallel_group)
                if self._modifier_rank is not None and not 0 <= self._modifier_rank < group_size:
                    raise ValueError(f"GatheredParameters: modifier_rank={self._modifier_rank} is not a rank of the "
                                     f"engine's data-parallel group (its ranks are 0..{group_size - 1})")
                modifies = self._modifier_rank == group_rank
                saved, copies = [], []
                for p in params:
                    whole = engine.whole_parameter(p)
                    # Which parameters the modifier rank changes is found on exit against their values now. One
                    # assembled from the shards is gathered again then (the shards are untouched); one that is the
                    # engine's own tensor (stages 0-2; ZeRO-3's persistent ones) changes in place, so the modifier
                    # rank keeps a copy. The same parameters are of each kind on every rank.
                    own = whole.data_ptr() == p.data_ptr() and whole.numel() == p.numel()
                    copies.append(_OWN if own and not modifies else whole.clone() if own else None)
                    saved.append(p.data)
                    p.data = whole
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


_OWN = object()  # in GatheredParameters' copies: the engine's own tensor, copied on the modifier rank only


def _place_in(group):
    """(this process's rank in `group`, its size); (0, 1) without torch.distributed."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _write_changed(engine, params, copies, modifier):
    """The modifier's values of the parameters it changed become every data-parallel rank's, in the engine's master and
    shards. `modifier` is a rank of the engine's data-parallel group, as DeepSpeed's modifier_rank is a rank of the
    parameter's partition group: under an mpu each group has its own modifier, and a tensor-parallel slice takes the
    value of its own group's. Only the changed ones: one left as it was keeps the master bit for bit (under
    bf16/fp16 a write of its 16-bit value would round the fp32 master)."""
    group = engine.data_parallel_group
    many = _place_in(group)[1] > 1
    source = dist.get_global_rank(group, modifier) if many else None
    with torch.no_grad():
        # The values before: a copy (the modifier's own tensors), or gathered again (collective, every rank).
        before = [None if copy is _OWN else copy if copy is not None else engine.whole_parameter(p)
                  for p, copy in zip(params, copies)]
        changed = torch.tensor([bool(b is not None and not torch.equal(p.data, b)) for p, b in zip(params, before)],
                               dtype=torch.uint8)
        if many:
            dist.broadcast(changed, source, group=group)
        written = [p for p, flag in zip(params, changed.tolist()) if flag]
        for p in written:
            if many:
                dist.broadcast(p.data, source, group=group)
        if written:
            engine.write_parameters(written)
