"""init_distributed: torch.distributed's default process group, which the engine then communicates over.

As DeepSpeed's does, it leaves torch.distributed initialised, so a script's own dist.get_rank() / dist.all_reduce
work; the engine takes the same group (one rendezvous, not two).
"""
import datetime
import itertools
import os

import torch
import torch.distributed as dist

# Each engine (and each zero.Init) of a process keeps its store keys under a prefix of its own; every rank builds
# them in the same order, so the n-th has the same prefix on every rank.
_comm_numbers = itertools.count()


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=datetime.timedelta(minutes=30), init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """Joins the job described by the torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, set by
    `dscpp launch`, torchrun or DeepSpeed's launcher). Does nothing when torch.distributed is initialised already.
    `dist_backend` defaults to nccl when CUDA is available, else gloo. Without RANK in the environment (a script run
    by hand) it starts a job of one process on 127.0.0.1:`distributed_port`, as DeepSpeed does."""
    if dist_init_required is False or dist.is_initialized():
        return
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"dscpp.init_distributed: dist_backend {backend!r} is not supported (gloo or nccl)")
    if init_method is None and "RANK" not in os.environ and rank in (-1, 0) and world_size in (-1, 1):
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK=os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group(backend=backend, init_method=init_method, timeout=timeout, rank=rank,
                            world_size=world_size)


def engine_comm_arguments(user="engine", group=None):
    """What dscpp._C.create_engine (or create_partitioned_init) needs to communicate: torch.distributed's default
    group (or `group`, one of its sub-groups) and its store, or None for a process alone. `user` names the prefix of
    its store keys; a sub-group's also names its ranks, as the groups of one kind (each data-parallel group of an mpu)
    are made at the same point on every rank."""
    if not dist.is_initialized():
        return dict(group=None, store=None, backend="", key_prefix="")
    from torch.distributed import distributed_c10d as c10d
    prefix = f"dscpp/{user}{next(_comm_numbers)}/"
    if group is None or group is dist.group.WORLD:
        group = c10d._get_default_group()
    else:
        prefix += "-".join(str(r) for r in sorted(c10d._pg_group_ranks[group])) + "/"
    return dict(group=group, store=c10d._get_default_store(), backend=dist.get_backend(group), key_prefix=prefix)
