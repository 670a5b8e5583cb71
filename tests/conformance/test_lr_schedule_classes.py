"""dscpp.runtime.lr_schedules against deepspeed.runtime.lr_schedules, in one process: each class built with the
same arguments over two equal torch optimizers, stepped the same way, must write the same lrs (and OneCycle's
betas) into the param groups and report the same get_lr / get_last_lr / get_mom / state_dict at every iteration.
Scripts build these classes themselves (and pass them to initialize, or step them), so this is their whole use."""
import math

import pytest
import torch

import ds_cpu  # noqa: F401  (before deepspeed)
from deepspeed.runtime import lr_schedules as ds_lrs

from dscpp.runtime import lr_schedules as our_lrs

TOL = 1e-12  # the same formulas in C++ and Python: libm's log/cos may differ in the last place


def _optimizer(kind, lrs, tensor_lr=False):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
    groups = [{"params": [p], "lr": torch.tensor(lr, dtype=torch.float64) if tensor_lr else lr}
              for p, lr in zip(params, lrs)]
    if kind == "adam":
        return torch.optim.Adam(groups, betas=(0.9, 0.999))
    return torch.optim.SGD(groups)


def _close(a, b):
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _close(x, y)
        return
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    a, b = float(a), float(b)
    assert math.isclose(a, b, rel_tol=TOL, abs_tol=TOL), (a, b)


def _observe(scheduler, optimizer, moms):
    seen = {"lr": scheduler.get_lr(), "groups": [g["lr"] for g in optimizer.param_groups],
            "state": scheduler.state_dict()["last_batch_iteration"]}
    if moms:
        seen["mom"] = scheduler.get_mom()
        seen["betas"] = [g["betas"] for g in optimizer.param_groups]
    return seen


CASES = [
    ("WarmupLR", {"warmup_num_steps": 10}, [0.1]),
    ("WarmupLR", {"warmup_min_lr": 0.01, "warmup_max_lr": 0.05, "warmup_num_steps": 7, "warmup_type": "linear"},
     [0.1]),
    ("WarmupLR", {"warmup_num_steps": 5}, [0.1, 0.2]),  # each group warms up to its own lr
    ("WarmupLR", {"warmup_min_lr": [0.0, 0.01], "warmup_max_lr": [0.1, 0.3], "warmup_num_steps": 4}, [0.1, 0.2]),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_max_lr": 0.1, "warmup_num_steps": 5}, [0.1]),
    ("WarmupDecayLR", {"total_num_steps": 12, "warmup_min_lr": 0.001, "warmup_max_lr": [0.1, 0.05],
                       "warmup_num_steps": 1, "warmup_type": "linear"}, [0.1, 0.2]),
    ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 5}, [0.1, 0.3]),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 10, "warmup_min_ratio": 0.2,
                        "cos_min_ratio": 0.1, "warmup_type": "linear"}, [0.02]),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 5}, [0.1]),
    ("OneCycle", {"cycle_min_lr": [0.001, 0.002], "cycle_max_lr": [0.01, 0.02], "cycle_min_mom": [0.8, 0.85],
                  "cycle_max_mom": [0.9, 0.95], "cycle_first_step_size": 4, "cycle_second_step_size": 6,
                  "decay_step_size": 2, "decay_lr_rate": 0.5, "decay_mom_rate": 0.1}, [0.1, 0.2]),
    ("OneCycle", {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 8,
                  "cycle_first_stair_count": 2, "cycle_second_stair_count": 3, "cycle_momentum": False}, [0.1]),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 2.0},
     [0.1]),
    ("LRRangeTest", {"lr_range_test_min_lr": [1e-3, 1e-2], "lr_range_test_step_size": 2,
                     "lr_range_test_staircase": True}, [0.1, 0.2]),
]


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float_lr", "tensor_lr"])
@pytest.mark.parametrize("name, kwargs, lrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_same_sequence_as_deepspeed(name, kwargs, lrs, tensor_lr):
    moms = name == "OneCycle" and kwargs.get("cycle_momentum", True)
    ours_opt, ds_opt = _optimizer("adam", lrs, tensor_lr), _optimizer("adam", lrs, tensor_lr)
    held = [g["lr"] for g in ours_opt.param_groups]
    ours = getattr(our_lrs, name)(ours_opt, **kwargs)
    ds = getattr(ds_lrs, name)(ds_opt, **kwargs)
    # Built at iteration -1: the starting lr (and betas) are on the optimizer before any step.
    a, b = _observe(ours, ours_opt, moms), _observe(ds, ds_opt, moms)
    for key in a:
        _close(a[key], b[key])
    for step in range(25):
        ours.step()
        ds.step()
        a, b = _observe(ours, ours_opt, moms), _observe(ds, ds_opt, moms)
        for key in a:
            _close(a[key], b[key])
        _close(ours.get_last_lr(), ds.get_last_lr())
        if name == "WarmupCosineLR":
            _close(ours.get_lr_ratio(), ds.get_lr_ratio())
    if tensor_lr:  # a tensor lr is written in place: the caller's reference still sees it
        assert all(g["lr"] is t for g, t in zip(ours_opt.param_groups, held))
    # An explicit iteration (a resume), then the state a checkpoint keeps.
    ours.step(3)
    ds.step(3)
    _close(_observe(ours, ours_opt, moms)["groups"], _observe(ds, ds_opt, moms)["groups"])
    again = getattr(our_lrs, name)(_optimizer("adam", lrs), **kwargs)
    again.load_state_dict(ours.state_dict())
    assert again.last_batch_iteration == 3
    again.step()
    ds.step()
    _close(again.get_lr(), ds.get_lr())


def test_module_names_match():
    for name in dir(ds_lrs):
        if name.isupper() and isinstance(getattr(ds_lrs, name), (str, list)):
            assert getattr(our_lrs, name) == getattr(ds_lrs, name), name


@pytest.mark.parametrize("name, kwargs", [
    ("WarmupLR", {"warmup_num_steps": 0}),
    ("WarmupLR", {"warmup_num_steps": None}),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": -1}),
    ("LRRangeTest", {"lr_range_test_step_size": 0}),
    ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 0.2, "cycle_first_step_size": 0}),
    ("OneCycle", {"cycle_min_lr": [0.1, 0.2, 0.3], "cycle_max_lr": 0.4}),
    ("WarmupLR", {"warmup_min_lr": [0.1, 0.2, 0.3]}),
])
def test_bad_arguments_raise_value_error_as_deepspeed(name, kwargs):
    for module in (ds_lrs, our_lrs):
        with pytest.raises(ValueError):
            getattr(module, name)(_optimizer("adam", [0.1, 0.2]), **kwargs)


def test_one_cycle_over_sgd_cycles_lr_only():
    ours_opt, ds_opt = _optimizer("sgd", [0.1]), _optimizer("sgd", [0.1])
    kwargs = {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 3}
    with pytest.warns(UserWarning, match="cycle_momentum"):
        ours = our_lrs.OneCycle(ours_opt, **kwargs)
    ds = ds_lrs.OneCycle(ds_opt, **kwargs)
    assert ours.get_mom() is None and ds.get_mom() is None
    for _ in range(8):
        ours.step()
        ds.step()
        _close(ours.get_lr(), ds.get_lr())
    assert "betas" not in ours_opt.param_groups[0]


@pytest.mark.parametrize("name", ["WarmupLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"])
def test_something_that_is_not_an_optimizer_is_a_type_error_as_deepspeeds(name):
    kwargs = {"WarmupCosineLR": {"total_num_steps": 10}, "OneCycle": {"cycle_min_lr": 0.1, "cycle_max_lr": 0.2}}
    for module in (ds_lrs, our_lrs):
        with pytest.raises(TypeError):
            getattr(module, name)(object(), **kwargs.get(name, {}))
