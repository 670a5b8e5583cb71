"""Runs one script under real DeepSpeed and under deepspeed.cpp, as real processes over loopback, and collects the
JSON lines it prints per step."""
import importlib.util
import json
import os

import pytest

# Where the two engines' arithmetic may differ (fp32 sums in another order), per step.
LOSS_TOL = 1e-5

HERE = os.path.dirname(os.path.abspath(__file__))


def _python_tests_conftest():
    """tests/python/conftest.py, whose run_ranks starts the ranks here too (loaded by path: both files are conftest)."""
    path = os.path.join(HERE, "..", "python", "conftest.py")
    spec = importlib.util.spec_from_file_location("dscpp_python_tests_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_python_conftest = _python_tests_conftest()
_run_ranks = _python_conftest.run_ranks
install_deepspeed_name = _python_conftest.install_deepspeed_name
free_port = _python_conftest.free_port


def run_script(impl, script_args, world=1, timeout=600):
    """`world` ranks of `python SCRIPT --impl IMPL ARGS...` with torchrun's environment; returns rank 0's step
    records (the lines that are JSON objects with a "step"). Fails the test with every rank's output if one fails."""
    outputs = _run_ranks(world, [script_args[0], "--impl", impl] + script_args[1:], timeout=timeout, cwd=HERE,
                         what=f"{impl}: a rank failed")
    return [json.loads(line) for line in outputs[0].splitlines() if line.startswith('{"step"')]


def write_config(tmp_path, config, name="ds_config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def assert_same_steps(ours, theirs, steps, tol=LOSS_TOL):
    """The two runs' records agree step by step: the lr exactly (both are the same double arithmetic), a client
    optimizer's group lrs exactly, the loss, the evaluation loss and (where DeepSpeed reports one) the gradient norm
    within `tol`."""
    assert len(ours) == len(theirs) == steps, (ours, theirs)
    for a, b in zip(ours, theirs):
        where = f"step {b['step']}: ours {a}, DeepSpeed {b}"
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12, abs=1e-15), where
        if b["group_lr"] is not None:
            assert a["group_lr"] == pytest.approx(b["group_lr"], rel=1e-12, abs=1e-15), where
        assert a["loss"] == pytest.approx(b["loss"], rel=tol, abs=tol), where
        if b["grad_norm"] is not None:
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=tol, abs=tol), where
        if "eval_loss" in b:
            assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=tol, abs=tol), where
