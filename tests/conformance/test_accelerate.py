"""Hugging Face Accelerate's DeepSpeed path (issue 50): the same Accelerate script (accelerate_script.py) on real
DeepSpeed and, unchanged, on ours through python/deepspeed-compat (the name `deepspeed`), per micro-batch loss within
1e-5 and the same lr, at ZeRO 0, 2 and 3 with gradient accumulation 2:
- one process, the plugin built in the script (`DeepSpeedPlugin(zero_stage=..., gradient_accumulation_steps=2)`);
- two processes started by `accelerate launch --use_deepspeed --deepspeed_config_file ds.json` (Accelerate's own
  launcher, torchrun underneath), the script's `Accelerator()` configured by it;
- `save_state` in the middle, then a second job's `load_state` + `skip_first_batches`: the resumed micro-batches equal
  the uninterrupted run's (model, optimizer moments, the client StepLR and the param groups' lr all come back).
On a CPU, Accelerate's DeepSpeed path sees each process as the only one (accelerate/state.py: no backend without a
GPU), so both ranks read the same batches; the engine still runs over two ranks (the script prints the world
torch.distributed saw), and averaging their equal gradients must give one process's numbers, under either engine."""
import itertools
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, LOSS_TOL, _python_conftest, _run_ranks, install_deepspeed_name, write_config

MICRO_BATCHES = 8
SAVE_AT = 4  # an accumulation boundary (gradient accumulation 2)
_runs = itertools.count()  # a records file per run


@pytest.fixture(scope="module")
def deepspeed_name(tmp_path_factory):
    return install_deepspeed_name(tmp_path_factory.mktemp("deepspeed_name"))


def records(output, path, ours, what, world=1):
    """Rank 0's JSON lines (from PATH.0), after checking which engine ran — ours announces itself ("[deepspeed.cpp]
    ZeRO stage ..."), DeepSpeed does not — and that every rank got to the script's end."""
    assert ("[deepspeed.cpp] ZeRO stage" in output) == ours, f"{what}:\n{output[-3000:]}"
    per_rank = []
    for rank in range(world):
        with open(f"{path}.{rank}") as f:
            per_rank.append([json.loads(line) for line in f])
        assert per_rank[-1] and per_rank[-1][-1] == {"ended": True}, f"{what}: rank {rank} stopped early:\n{output}"
    return per_rank[0][:-1]


def on_path(monkeypatch, first):
    if first:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([first, os.environ.get("PYTHONPATH", "")]))


def one_process(args, monkeypatch, tmp_path, name=None):
    """accelerate_script.py on one process (torchrun's environment); `name`: ours through the name `deepspeed`."""
    path = str(tmp_path / f"records-{next(_runs)}")
    with monkeypatch.context() as m:
        on_path(m, name)
        what = "ours" if name else "DeepSpeed"
        out = _run_ranks(1, ["accelerate_script.py", "--records", path] + args, timeout=600, cwd=HERE, what=what)[0]
    return records(out, path, bool(name), what)


def accelerate_launch(config_file, args, monkeypatch, tmp_path, name=None):
    """`accelerate launch --use_deepspeed --deepspeed_config_file CONFIG` of accelerate_script.py on two processes."""
    path = str(tmp_path / f"records-{next(_runs)}")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--use_deepspeed",
               "--deepspeed_config_file", config_file, "--main_process_port", str(_python_conftest.free_port()),
               "accelerate_script.py", "--from_launcher", "--records", path] + args
    with monkeypatch.context() as m:
        on_path(m, name)
        m.setenv("OMP_NUM_THREADS", "1")
        done = subprocess.run(command, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600, env=dict(os.environ))
    what = f"accelerate launch ({'ours' if name else 'DeepSpeed'})"
    # Real DeepSpeed leaves process groups of its own for interpreter shutdown to free, and a rank of it sometimes
    # aborts there, after the script's last line ("terminate called without an active exception": issue 49's abort,
    # tests/conformance/exit_under_load.sh). Its numbers are whole then; ours must also exit cleanly.
    assert done.returncode == 0 or not name, f"{what} failed:\n{done.stdout[-5000:]}"
    return records(done.stdout, path, bool(name), what, world=2)


def assert_same(ours, theirs, count):
    assert len(ours) == len(theirs) == count, (ours, theirs)
    for a, b in zip(ours, theirs):
        assert a["step"] == b["step"] and a["lr"] == b["lr"], (a, b)
        assert a["loss"] == pytest.approx(b["loss"], abs=LOSS_TOL, rel=0), (a, b)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_accelerate_script_on_one_process_follows_real_deepspeed(stage, deepspeed_name, monkeypatch, tmp_path):
    # Dropout on: the engines must draw nothing from torch's generator that the other does not.
    args = ["--zero_stage", str(stage), "--grad_accum", "2", "--micro_batches", str(MICRO_BATCHES), "--dropout", "0.1"]
    theirs = one_process(args, monkeypatch, tmp_path)
    ours = one_process(args, monkeypatch, tmp_path, deepspeed_name)
    assert [r["world"] for r in ours] == [1] * MICRO_BATCHES
    assert_same(ours, theirs, MICRO_BATCHES)


def test_an_epoch_that_ends_mid_accumulation_steps_there_as_real_deepspeed(deepspeed_name, monkeypatch, tmp_path):
    # Five batches per epoch at gradient accumulation 2: Accelerate ends each epoch with a boundary of its own
    # (engine.set_gradient_accumulation_boundary(True) on the engine's first micro-step of a pair), whose step
    # applies one micro-batch's gradient; the StepLR counts those steps too. ZeRO-3, two epochs.
    args = ["--zero_stage", "3", "--grad_accum", "2", "--micro_batches", "5", "--epochs", "2", "--dropout", "0.1"]
    theirs = one_process(args, monkeypatch, tmp_path)
    ours = one_process(args, monkeypatch, tmp_path, deepspeed_name)
    assert_same(ours, theirs, 10)
    # steps after micro-batches 2, 4, 5 (the epoch's end), 7, 9, 10: the lr halves every two of them (read before
    # each micro-batch)
    assert [r["lr"] for r in ours] == [1e-2] * 4 + [5e-3] * 3 + [2.5e-3] * 3, ours


def test_save_state_then_load_state_and_skip_first_batches_resumes_exactly(deepspeed_name, monkeypatch, tmp_path):
    base = ["--zero_stage", "2", "--grad_accum", "2", "--micro_batches", str(MICRO_BATCHES), "--dropout", "0",
            "--save_dir", str(tmp_path / "state"), "--save_at", str(SAVE_AT)]
    whole = one_process(base, monkeypatch, tmp_path, deepspeed_name)
    # Accelerate's files beside the engine's checkpoint (tag pytorch_model): the RNG states and the sampler's.
    assert {"latest", "pytorch_model", "random_states_0.pkl"} <= set(os.listdir(tmp_path / "state"))
    resumed = one_process(base + ["--resume"], monkeypatch, tmp_path, deepspeed_name)
    assert_same(resumed, whole[SAVE_AT:], MICRO_BATCHES - SAVE_AT)
    assert resumed[0]["lr"] != whole[0]["lr"]  # the StepLR moved before the save: its lr came back with the state


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_accelerate_launch_with_a_deepspeed_config_file_on_two_processes(stage, deepspeed_name, monkeypatch,
                                                                         tmp_path):
    config = write_config(tmp_path, {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                     "steps_per_print": 1000, "zero_optimization": {"stage": stage}})
    args = ["--micro_batches", str(MICRO_BATCHES), "--dropout", "0"]
    theirs = accelerate_launch(config, args, monkeypatch, tmp_path)
    resume = ["--save_dir", str(tmp_path / "state"), "--save_at", str(SAVE_AT)] if stage == 3 else []
    ours = accelerate_launch(config, args + resume, monkeypatch, tmp_path, deepspeed_name)
    assert [r["world"] for r in ours] == [2] * MICRO_BATCHES
    assert_same(ours, theirs, MICRO_BATCHES)
    if resume:  # ZeRO-3's partitioned state saved by two ranks, loaded by two
        resumed = accelerate_launch(config, args + resume + ["--resume"], monkeypatch, tmp_path, deepspeed_name)
        assert_same(resumed, ours[SAVE_AT:], MICRO_BATCHES - SAVE_AT)
