"""dscpp.comm, as deepspeed.comm: init_distributed — torch.distributed's default process group, which the engine then
communicates over — and the calls scripts (and Hugging Face Accelerate) make through deepspeed.comm.

As DeepSpeed's does, init_distributed leaves torch.distributed initialised, so a script's own dist.get_rank() /
dist.all_reduce work; the engine takes the same group (one rendezvous, not two). The script-side calls below are
torch.distributed's, as DeepSpeed's facade forwards them (its default backend being torch's): the engine's own
collectives go through its C++ Comm, not through these.
"""
import atexit
import gc
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
    if backend == "gloo":  # NCCL's teardown is its own (its destroy can wait on peers); only Gloo's is mended here
        atexit.register(_destroy_at_exit)


def _destroy_at_exit():
    """Destroys the process group init_distributed made, while the interpreter is still whole. Left to interpreter
    shutdown, a Gloo group is freed with its worker threads possibly still holding the last reference to a finished
    collective's tensors, whose release then needs the GIL of an interpreter being torn down: the process aborts
    after its last step ("terminate called without an active exception"; PyTorch's issue 190489 and PR 179291). Real
    DeepSpeed leaves the group alive and was measured aborting so (tests/conformance/exit_under_load.sh). An engine
    the program dropped may still be waiting in a reference cycle for the collector, holding the C++ side of the
    groups it runs over (an mpu's sub-groups too): it is collected first, for the same reason."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def engine_comm_arguments(user="engine", group=None):
    """What dscpp._C.comm_over (an engine's comms) or create_partitioned_init needs to communicate: torch.distributed's
    default group (or `group`, one of its sub-groups) and its store, or None for a process alone. `user` names the
    prefix of its store keys; a sub-group's also names its ranks, as the groups of one kind (each data-parallel group
    of an mpu) are made at the same point on every rank."""
    if not dist.is_initialized():
        return dict(group=None, store=None, backend="", key_prefix="")
    from torch.distributed import distributed_c10d as c10d
    prefix = f"dscpp/{user}{next(_comm_numbers)}/"
    if group is None or group is dist.group.WORLD:
        group = c10d._get_default_group()
    else:
        prefix += "-".join(str(r) for r in sorted(c10d._pg_group_ranks[group])) + "/"
    return dict(group=group, store=c10d._get_default_store(), backend=dist.get_backend(group), key_prefix=prefix)


# ---- the script-side calls of deepspeed.comm: torch.distributed's, with DeepSpeed's signatures ---------------------

ReduceOp = dist.ReduceOp


def is_available():
    return dist.is_available()


def is_initialized():
    return dist.is_initialized()


def get_rank(group=None):
    """This process's rank (in `group`); 0 when nothing is initialised, as a single process is."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def get_world_size(group=None):
    return dist.get_world_size(group) if dist.is_initialized() else 1


def get_local_rank():
    """LOCAL_RANK from the launcher's environment (0 when absent), as DeepSpeed reads it."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_global_rank(group=None, group_rank=0):
    return dist.get_global_rank(group, group_rank)


def new_group(ranks):
    return dist.new_group(ranks)


def barrier(group=None, async_op=False, device_ids=None):
    return dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False):
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False):
    return dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    return dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes, group=group,
                                  async_op=async_op)


def send(tensor, dst, group=None, tag=0):
    return dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0):
    return dist.recv(tensor, src, group=group, tag=tag)


def destroy_process_group(group=None):
    if dist.is_initialized():
        dist.destroy_process_group(group)
