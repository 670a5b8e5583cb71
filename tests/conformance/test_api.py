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


def test_helpers_scripts_import_have_deepspeeds_signatures():
    import deepspeed.checkpoint.utils
    import deepspeed.runtime.utils
    import dscpp.checkpoint.utils
    import dscpp.runtime.utils
    pairs = [(dscpp.checkpoint.utils.clone_tensors_for_torch_save,
              deepspeed.checkpoint.utils.clone_tensors_for_torch_save),
             (dscpp.runtime.utils.see_memory_usage, deepspeed.runtime.utils.see_memory_usage),
             (dscpp.utils.RepeatingLoader, deepspeed.utils.RepeatingLoader)]
    for ours, theirs in pairs:
        assert parameters(ours) == parameters(theirs), ours.__name__


def test_deepspeeds_cpu_optimizers_take_deepspeeds_arguments():
    # Hugging Face Accelerate builds them with keywords (lr, weight_decay, adamw_mode) over a torch optimizer's groups
    import deepspeed.ops.adagrad
    import deepspeed.ops.adam
    import deepspeed.ops.lion
    import dscpp.ops.adagrad
    import dscpp.ops.adam
    import dscpp.ops.lion
    pairs = [(dscpp.ops.adam.DeepSpeedCPUAdam, deepspeed.ops.adam.DeepSpeedCPUAdam),
             (dscpp.ops.adagrad.DeepSpeedCPUAdagrad, deepspeed.ops.adagrad.DeepSpeedCPUAdagrad),
             (dscpp.ops.lion.DeepSpeedCPULion, deepspeed.ops.lion.DeepSpeedCPULion)]
    for ours, theirs in pairs:
        assert parameters(ours) == parameters(theirs), ours.__name__


def test_repeating_loader_restarts_as_deepspeeds():
    import torch
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    ours = dscpp.utils.RepeatingLoader(torch.utils.data.DataLoader(data, batch_size=4))
    theirs = deepspeed.utils.RepeatingLoader(torch.utils.data.DataLoader(data, batch_size=4))
    for _ in range(7):  # two passes and a bit, across the short last batch
        assert torch.equal(next(ours)[0], next(theirs)[0])
    with pytest.raises(StopIteration):
        next(dscpp.utils.RepeatingLoader([]))


def test_clone_tensors_for_torch_save_as_deepspeeds():
    import collections
    import torch
    base = torch.arange(12.0)
    item = {"a": base[:4], "b": [base[4:8], (base[8:], 3)], "c": "x",
            "d": collections.OrderedDict(e=torch.ones(2, dtype=torch.bfloat16))}
    ours = dscpp.checkpoint.utils.clone_tensors_for_torch_save(item)
    theirs = deepspeed.checkpoint.utils.clone_tensors_for_torch_save(item)
    assert type(ours["d"]) is collections.OrderedDict and type(ours["b"][1]) is tuple
    assert ours["c"] == theirs["c"] and ours["b"][1][1] == 3
    for x, y in [(ours["a"], theirs["a"]), (ours["b"][0], theirs["b"][0]), (ours["b"][1][0], theirs["b"][1][0]),
                 (ours["d"]["e"], theirs["d"]["e"])]:
        assert torch.equal(x, y) and x.dtype == y.dtype
        # A copy of its own: saving it writes 4 values, not the 12 of the buffer the view was cut from.
        assert x.untyped_storage().nbytes() == x.numel() * x.element_size()


def test_see_memory_usage_prints_only_when_forced(capsys):
    import dscpp.runtime.utils
    dscpp.runtime.utils.see_memory_usage("quiet")
    assert capsys.readouterr().out == ""
    dscpp.runtime.utils.see_memory_usage("after init", force=True)
    out = capsys.readouterr().out
    assert out.startswith("after init\n") and "CPU memory of this process: resident" in out
