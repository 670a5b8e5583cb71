"""dscpp.utils.groups: DeepSpeed's process groups (deepspeed.utils.groups): expert-parallel and expert-data-parallel,
and sequence-parallel (DeepSpeed-Ulysses).

Sequence parallelism of size P (the config's "sequence_parallel_size", or initialize's mesh_param (dp, P)): the
sequence-parallel groups are P consecutive ranks (DeepSpeed's ("data_parallel", "sequence_parallel") mesh, row-major),
the data-parallel groups the ranks with the same index modulo P, and the sequence-data-parallel group — where ZeRO
partitions and gradients are reduced — every rank. dscpp.initialize makes them; the getters are DeepSpeed's.

For ep_size P over the data-parallel ranks (every rank of the job; an mpu's data-parallel ranks are not supported
with P > 1 yet), the groups are the C++ engine's (moe::expert_parallel_ranks / expert_data_parallel_ranks): P
consecutive ranks exchange tokens (expert parallel), the ranks with the same index modulo P hold the same experts
and average their gradients (expert data parallel). Each is a torch.distributed group, for a script's own use, and
a dscpp._C.Comm over it, for the C++ side. Groups are named as DeepSpeed names them, "ep_size_<P>"."""
import torch.distributed as dist

from .. import _C
from ..comm import engine_comm_arguments

_groups = {}  # "ep_size_<P>" → _ExpertGroups


class _ExpertGroups:
    def __init__(self, ep_size, expert_parallel, expert_data_parallel, ep_comm, edp_comm):
        self.ep_size = ep_size
        self.expert_parallel = expert_parallel            # torch.distributed group, or None for a process alone
        self.expert_data_parallel = expert_data_parallel
        self.ep_comm = ep_comm                            # dscpp._C.Comm over each
        self.edp_comm = edp_comm


def _create_expert_and_data_parallel(expert_parallel_size_, use_data_before_expert_parallel_=False):
    """Collective over the job (every rank calls it, in the same order): makes the groups for ep_size
    `expert_parallel_size_` once; later calls for the same size return the same groups. ValueError naming both
    numbers when the size does not divide the number of ranks."""
    if use_data_before_expert_parallel_:
        raise NotImplementedError("dscpp.utils.groups: use_data_before_expert_parallel_ is not supported (the "
                                  "expert-parallel groups are consecutive ranks, DeepSpeed's default)")
    name = f"ep_size_{expert_parallel_size_}"
    if name in _groups:
        return _groups[name]
    world = dist.get_world_size() if dist.is_initialized() else 1
    ep_ranks = _C.expert_parallel_ranks(world, expert_parallel_size_)  # ValueError: the size must divide the world
    edp_ranks = _C.expert_data_parallel_ranks(world, expert_parallel_size_)
    if not dist.is_initialized():
        alone = _C.comm_over(None, None, "", "")
        _groups[name] = _ExpertGroups(expert_parallel_size_, None, None, alone, alone)
        return _groups[name]
    rank = dist.get_rank()
    # torch.distributed.new_group is collective over the whole job: every rank makes every group, in one order.
    mine = {}
    for kind, lists in (("expert_parallel", ep_ranks), ("expert_data_parallel", edp_ranks)):
        for ranks in lists:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    ep_comm = _C.comm_over(**engine_comm_arguments("moe_ep", mine["expert_parallel"]))
    edp_comm = _C.comm_over(**engine_comm_arguments("moe_edp", mine["expert_data_parallel"]))
    _groups[name] = _ExpertGroups(expert_parallel_size_, mine["expert_parallel"], mine["expert_data_parallel"],
                                  ep_comm, edp_comm)
    return _groups[name]


def _get_expert_parallel_group_dict():
    return {name: g.expert_parallel for name, g in _groups.items()}


def _get_expert_data_parallel_group_dict():
    return {name: g.expert_data_parallel for name, g in _groups.items()}


def _named(group_name):
    if group_name not in _groups:
        raise KeyError(f"dscpp.utils.groups: no expert groups named {group_name!r} (made so far: {sorted(_groups)}); "
                       "dscpp.initialize makes them for the model's MoE layers")
    return _groups[group_name]


def _get_expert_parallel_group(group_name):
    return _named(group_name).expert_parallel


def _get_expert_data_parallel_group(group_name):
    return _named(group_name).expert_data_parallel


def _get_expert_parallel_world_size(group_name):
    return _named(group_name).ep_comm.world_size


def _get_expert_parallel_rank(group_name):
    return _named(group_name).ep_comm.rank


def _get_expert_data_parallel_world_size(group_name):
    return _named(group_name).edp_comm.world_size


def _get_expert_data_parallel_rank(group_name):
    return _named(group_name).edp_comm.rank


# ---- sequence parallelism (DeepSpeed-Ulysses) ----------------------------------------------------------------------

_sequence = None  # _SequenceGroups once dscpp.initialize has made them
mpu = None  # the mpu dscpp.initialize was given (Megatron's parallel state): its data-parallel group is the engine's


class _SequenceGroups:
    def __init__(self, size, sequence_parallel, data_parallel):
        self.size = size
        self.sequence_parallel = sequence_parallel  # this rank's torch.distributed group of P consecutive ranks
        self.data_parallel = data_parallel          # the ranks holding the same slice of their sequences


def _create_sequence_parallel_groups(sequence_parallel_size):
    """Collective over the job (dscpp.initialize calls it on every rank): the groups for size P, once; a later call
    with another size is a ValueError (a job has one layout)."""
    global _sequence
    if _sequence is not None:
        if _sequence.size != sequence_parallel_size:
            raise ValueError(f"dscpp.utils.groups: sequence-parallel groups of {_sequence.size} ranks exist already; "
                             f"this job cannot also have groups of {sequence_parallel_size}")
        return _sequence
    world = dist.get_world_size()
    if world % sequence_parallel_size:
        raise ValueError(f"dscpp.utils.groups: sequence_parallel_size {sequence_parallel_size} does not divide the "
                         f"{world} ranks")
    rank, mine = dist.get_rank(), {}
    sequences = [list(range(s, s + sequence_parallel_size)) for s in range(0, world, sequence_parallel_size)]
    slices = [list(range(i, world, sequence_parallel_size)) for i in range(sequence_parallel_size)]
    for kind, lists in (("sequence", sequences), ("data", slices)):
        for ranks in lists:  # torch.distributed.new_group is collective: every rank makes every group, in order
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    _sequence = _SequenceGroups(sequence_parallel_size, mine["sequence"], mine["data"])
    return _sequence


def _get_sequence_parallel_group():
    if _sequence is None:
        raise KeyError("No sequence parallel group found")
    return _sequence.sequence_parallel


def _get_sequence_parallel_world_size():
    return 1 if _sequence is None else _sequence.size


def _get_sequence_parallel_rank():
    return 0 if _sequence is None else dist.get_rank() % _sequence.size


# The sequence-data-parallel group is where ZeRO partitions and gradients are reduced: here every rank. (DeepSpeed
# 0.19.8's getters answer its mesh's "data_parallel" dimension for it, though its engine reduces over every rank too.)
def _get_sequence_data_parallel_group():
    return dist.group.WORLD


def _get_sequence_data_parallel_world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def _get_sequence_data_parallel_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def _get_data_parallel_group():
    if mpu is not None:
        return mpu.get_data_parallel_group()
    return dist.group.WORLD if _sequence is None else _sequence.data_parallel


def _get_data_parallel_world_size():
    if mpu is not None:
        return mpu.get_data_parallel_world_size()
    if not dist.is_initialized():
        return 1
    return dist.get_world_size() // _get_sequence_parallel_world_size()


def _get_data_parallel_rank():
    if mpu is not None:
        return mpu.get_data_parallel_rank()
    if not dist.is_initialized():
        return 0
    return dist.get_rank() // _get_sequence_parallel_world_size()


def consecutive_group(size, what):
    """This rank's torch.distributed group of `size` consecutive ranks (ranks [k·size, (k+1)·size)), as DeepSpeed
    makes its inference tensor-parallel groups. Every rank makes every group, in one order (new_group is collective
    over the job). ValueError starting with `what` (the setting that asked for them) when size does not divide the
    world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size != 0:
        raise ValueError(f"{what} {size} does not divide the world size {world}")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return mine
