"""The names scripts call on `deepspeed` exist on `dscpp` with DeepSpeed's signatures (parameter names, order and
defaults), read from the installed DeepSpeed itself. What each does is held against DeepSpeed by the other files here
and by tests/python."""
import inspect

import ds_cpu  # noqa: F401  (before importing deepspeed: its CPU accelerator)
import deepspeed
import deepspeed.comm
import pytest

import dscpp

COMM = ["is_available", "is_initialized", "get_rank", "get_world_size", "get_local_rank", "get_global_rank",
        "new_group", "barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
        "reduce_scatter_tensor", "all_to_all_single", "send", "recv", "destroy_process_group"]


def parameters(fn):
    # DeepSpeed wraps its collectives in a logging decorator (comm.timed_op) that does not keep the signature: read
    # the function it wraps, held in the wrapper's closure.
    for cell in getattr(fn, "__closure__", None) or []:
        if inspect.isfunction(cell.cell_contents):
            fn = cell.cell_contents
            break
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def same_defaults(ours, theirs):
    """DeepSpeed's ReduceOp is its own enum; ours is torch's, which it maps onto: compare those by name."""
    def norm(d):
        return getattr(d, "name", d) if "ReduceOp" in type(d).__name__ or "RedOpType" in type(d).__name__ else d
    return [(n, norm(d)) for n, d in ours] == [(n, norm(d)) for n, d in theirs]


@pytest.mark.parametrize("name", COMM)
def test_comm_function_has_deepspeeds_signature(name):
    ours, theirs = getattr(dscpp.comm, name), getattr(deepspeed.comm, name)
    # DeepSpeed's facade adds tracing keywords (prof, log_name, debug) that a script does not pass: ours must take every
    # parameter a script passes, in DeepSpeed's order, with its defaults.
    traced = {"prof", "log_name", "debug", "use_caller_name"}
    theirs_p = [p for p in parameters(theirs) if p[0] not in traced]
    assert same_defaults(parameters(ours), theirs_p), (parameters(ours), theirs_p)


def test_init_distributed_and_initialize_take_deepspeeds_arguments():
    for ours, theirs in [(dscpp.init_distributed, deepspeed.init_distributed), (dscpp.initialize, deepspeed.initialize)]:
        names = [n for n, _ in parameters(theirs)]
        assert [n for n, _ in parameters(ours)][:len(names)] == names
