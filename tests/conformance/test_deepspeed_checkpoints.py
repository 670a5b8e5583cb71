"""A run started under real DeepSpeed, continued under our engine, and the other way round (docs/checkpoints.md,
"Coming from DeepSpeed" and "Going back to DeepSpeed").

Real DeepSpeed trains train_script.py's MLP 6 steps on 2 processes at ZeRO 0-3, saving after step 3; `dscpp convert
--from deepspeed` turns that checkpoint into ours and our engine continues from it for 3 steps: at the same layout
against DeepSpeed's own steps 4-6 of that run, and at others (1 process; 4 processes at ZeRO 3) against DeepSpeed's
continuation from its universal checkpoint (ds_to_universal) at that layout. At the load the master weights equal
DeepSpeed's zero_to_fp32 reconstruction and the Adam moments its universal files, bit for bit. A file holding a
pickled object that is not data is refused naming it, without running it; a truncated one names the file.

The other way, `dscpp convert --to deepspeed` writes DeepSpeed's universal checkpoint of our run, or the files
DeepSpeed itself saves at one ZeRO stage (0-3) and world size, which real DeepSpeed continues like our own
continuation: at ZeRO 0-3, on 1, 2, 3 and 4 processes, with BatchNorm buffers and frozen parameters, under OneCycle's
cycled momentum, in bf16. Cases whose id ends in "long" run in the long set (CMakeLists.txt).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import HERE, assert_same_steps, free_port, run_script, write_config

SAVE_AT, STEPS = 3, 6
DSCPP = os.path.join(os.environ.get("DSCPP_BINARY_DIR", os.path.join(HERE, "..", "..", "build")), "dscpp")


WARMUP = {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 0.01}}
# OneCycle cycles Adam's beta1 each step (cycle_momentum, its default), which DeepSpeed's load does not restore.
ONE_CYCLE = {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 4,
                                            "cycle_min_mom": 0.8, "cycle_max_mom": 0.9}}


def config(stage, universal=False, bf16=False, scheduler=WARMUP):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
         "scheduler": scheduler, "zero_optimization": {"stage": stage}}
    if universal:
        c["checkpoint"] = {"load_universal": True}
    if bf16:
        c["bf16"] = {"enabled": True}
    return c


@pytest.fixture(scope="module")
def deepspeed_run(tmp_path_factory):
    """deepspeed_run(stage[, bf16, model flags]) -> (checkpoint dir, DeepSpeed's 6 step records): one real DeepSpeed
    run each."""
    runs = {}

    def run(stage, bf16=False, model=()):
        if (stage, bf16, model) not in runs:
            d = tmp_path_factory.mktemp(f"deepspeed_zero{stage}")
            records = run_script("deepspeed", ["train_script.py", "--config", write_config(d, config(stage, bf16=bf16)),
                                               "--steps", str(STEPS), "--save_dir", str(d / "ckpt"),
                                               "--save_at", str(SAVE_AT), *model], world=2)
            assert len(records) == STEPS
            runs[stage, bf16, model] = (d / "ckpt", records)
        return runs[stage, bf16, model]
    return run


def convert(source, out):
    return subprocess.run([DSCPP, "convert", "--from", "deepspeed", str(source), str(out)], capture_output=True,
                          text=True, timeout=300)


def converted(source, out):
    """Our checkpoint's tensors ("master/fc1.weight", "exp_avg/...") after converting `source` into `out`."""
    result = convert(source, out)
    assert result.returncode == 0, result.stderr
    return load_file(str(out / f"global_step{SAVE_AT}" / "rank_00000.safetensors"))


def continue_ours(out, stage, world, tmp_path, bf16=False, model=()):
    return run_script("dscpp", ["train_script.py", "--config",
                                write_config(tmp_path, config(stage, bf16=bf16), f"ours{stage}.json"),
                                "--steps", str(STEPS - SAVE_AT), "--load_dir", str(out), *model], world=world)


def to_universal(ckpt, tmp_path):
    """DeepSpeed's own ds_to_universal of the checkpoint (its tag's folder per parameter, and latest_universal)."""
    out = tmp_path / "universal"
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                    str(ckpt / f"global_step{SAVE_AT}"), "--output_folder", str(out / f"global_step{SAVE_AT}"),
                    "--inject_missing_state"], check=True, capture_output=True, cwd=HERE,
                   env=dict(os.environ, DS_ACCELERATOR="cpu"))
    return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3], ids=["zero0_long", "zero1", "zero2_long", "zero3"])
def test_continues_a_deepspeed_run_at_its_layout(stage, deepspeed_run, tmp_path):
    ckpt, theirs = deepspeed_run(stage)
    assert converted(ckpt, tmp_path / "ours")
    ours = continue_ours(tmp_path / "ours", stage, 2, tmp_path)
    assert_same_steps(ours, theirs[SAVE_AT:], STEPS - SAVE_AT)


@pytest.mark.parametrize("stage", [1, 3], ids=["zero1_long", "zero3"])
def test_buffers_and_frozen_parameters_carry_over(stage, deepspeed_run, tmp_path):
    """BatchNorm's running statistics (DeepSpeed's module state) and a frozen parameter (in the module at ZeRO 1, in
    per-rank frozen_param_fragments at ZeRO 3) become the converted checkpoint's module tensors, whole; the
    continuation, which evaluates with them, follows DeepSpeed's."""
    model = ("--model", "batchnorm", "--freeze", "fc1.bias", "--eval")
    ckpt, theirs = deepspeed_run(stage, model=model)
    ours = converted(ckpt, tmp_path / "ours")
    assert ours["module/fc1.bias"].shape == (32,) and "master/fc1.bias" not in ours
    assert not torch.equal(ours["module/norm.running_mean"], torch.zeros(32))
    assert_same_steps(continue_ours(tmp_path / "ours", stage, 2, tmp_path, model=model), theirs[SAVE_AT:],
                      STEPS - SAVE_AT)


def test_continues_a_bf16_deepspeed_run_long(deepspeed_run, tmp_path):
    """DeepSpeed names a bf16 run's optimizer files bf16_zero_pp_rank_*. The first step after the load is a forward
    of the same bf16 rounding of the same master weights: equal. Later steps differ by the order of bf16 sums, as
    every bf16 comparison with DeepSpeed (test_training.py's bound: a few of bf16's steps)."""
    ckpt, theirs = deepspeed_run(2, bf16=True)
    assert converted(ckpt, tmp_path / "ours")
    ours = continue_ours(tmp_path / "ours", 2, 2, tmp_path, bf16=True)
    assert ours[0]["loss"] == theirs[SAVE_AT]["loss"]
    assert_same_steps(ours, theirs[SAVE_AT:], STEPS - SAVE_AT, tol=2e-2)


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["zero1_long", "zero2_long", "zero3"])
def test_master_weights_and_moments_are_deepspeeds_bit_for_bit(stage, deepspeed_run, tmp_path):
    """Against DeepSpeed's own reassembly: zero_to_fp32 for the weights, ds_to_universal's files for the moments."""
    ckpt, _ = deepspeed_run(stage)
    ours = converted(ckpt, tmp_path / "ours")
    universal = to_universal(ckpt, tmp_path) / f"global_step{SAVE_AT}" / "zero"
    weights = subprocess.run(
        [sys.executable, "-c", "import ds_cpu, sys, torch; from deepspeed.utils.zero_to_fp32 import "
         "get_fp32_state_dict_from_zero_checkpoint as f; torch.save(dict(f(sys.argv[1])), sys.argv[2])",
         str(ckpt), str(tmp_path / "fp32.pt")], check=True, capture_output=True, cwd=HERE)
    assert weights.returncode == 0
    fp32 = torch.load(tmp_path / "fp32.pt", weights_only=True)
    assert sorted(fp32) == sorted(k.split("/", 1)[1] for k in ours if k.startswith("master/"))
    for name, value in fp32.items():
        assert torch.equal(ours["master/" + name], value.reshape(-1)), name
        for kind in ("exp_avg", "exp_avg_sq"):
            saved = torch.load(universal / name / f"{kind}.pt", weights_only=False)
            saved = saved["param"] if isinstance(saved, dict) else saved
            assert torch.equal(ours[f"{kind}/{name}"], saved.reshape(-1)), (kind, name)


@pytest.mark.parametrize("stage,world", [(2, 1), (3, 4)], ids=["zero2_to_one_long", "zero3_to_four"])
def test_continues_at_another_world_size(stage, world, deepspeed_run, tmp_path):
    """Ours at `world` processes (ZeRO 0 on one, ZeRO 3 on four) from the converted checkpoint, against DeepSpeed's
    continuation at that layout from its universal checkpoint (DeepSpeed loads universal checkpoints under ZeRO only:
    its single process runs ZeRO 1, the same arithmetic). Converting the universal checkpoint gives the same tensors
    as converting the ZeRO one."""
    ckpt, _ = deepspeed_run(stage)
    ours_from_zero = converted(ckpt, tmp_path / "ours")
    universal = to_universal(ckpt, tmp_path)
    ours_from_universal = converted(universal, tmp_path / "ours_from_universal")
    assert sorted(ours_from_zero) == sorted(ours_from_universal)
    for name, value in ours_from_zero.items():
        assert torch.equal(value, ours_from_universal[name]), name

    their_stage = 1 if world == 1 else stage
    theirs = run_script("deepspeed", ["train_script.py", "--config",
                                      write_config(tmp_path, config(their_stage, universal=True), "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(universal)], world=world)
    ours = continue_ours(tmp_path / "ours", 0 if world == 1 else stage, world, tmp_path)
    assert_same_steps(ours, theirs, STEPS - SAVE_AT)


class Runs:
    """A pickled object that would run a command if unpickled by torch.load(weights_only=False)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("payload", ["namespace", "command"])
def test_a_pickled_object_is_refused_by_name_and_never_run(payload, deepspeed_run, tmp_path):
    ckpt, _ = deepspeed_run(1)
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    states = copy / f"global_step{SAVE_AT}" / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    marker = tmp_path / "ran"
    saved["args"] = argparse.Namespace(lr=0.1) if payload == "namespace" else Runs(marker)
    torch.save(saved, states)
    result = convert(copy, tmp_path / "out")
    assert result.returncode == 1
    name = "argparse.Namespace" if payload == "namespace" else f"{os.system.__module__}.system"
    assert str(states) in result.stderr and f"'{name}'" in result.stderr and "nothing was executed" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "out" / f"global_step{SAVE_AT}").exists()


def test_a_truncated_file_is_named(deepspeed_run, tmp_path):
    ckpt, _ = deepspeed_run(1)
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    optim = copy / f"global_step{SAVE_AT}" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])
    result = convert(copy, tmp_path / "out")
    assert result.returncode == 1
    assert str(optim) in result.stderr and "not a readable torch.save file" in result.stderr
    assert not (tmp_path / "out" / f"global_step{SAVE_AT}").exists()


def test_loading_a_deepspeed_checkpoint_directly_says_how_to_convert_it(deepspeed_run, tmp_path):
    ckpt, _ = deepspeed_run(1)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    result = subprocess.run([sys.executable, "train_script.py", "--impl", "dscpp", "--config",
                             write_config(tmp_path, config(1)), "--load_dir", str(ckpt)], cwd=HERE, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "a checkpoint written by DeepSpeed" in result.stderr
    assert "dscpp convert --from deepspeed" in result.stderr


# ---- the other way: a run started here, continued by real DeepSpeed ----

@pytest.fixture(scope="module")
def our_run(tmp_path_factory):
    """our_run(stage) -> (checkpoint dir, our 6 step records): our engine's run of the same script, saving at 3."""
    runs = {}

    def run(stage, model=(), scheduler=WARMUP, bf16=False):
        key = (stage, model, json.dumps(scheduler), bf16)
        if key not in runs:
            d = tmp_path_factory.mktemp(f"ours_zero{stage}")
            records = run_script("dscpp", ["train_script.py", "--config",
                                           write_config(d, config(stage, scheduler=scheduler, bf16=bf16)),
                                           "--steps", str(STEPS), "--save_dir", str(d / "ckpt"),
                                           "--save_at", str(SAVE_AT), *model], world=2)
            assert len(records) == STEPS
            runs[key] = (d / "ckpt", records)
        return runs[key]
    return run


def to_deepspeed(source, out, *flags):
    result = subprocess.run([DSCPP, "convert", "--to", "deepspeed", *flags, str(source), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("stage,world,their_stage",
                         [(1, 2, 1), (2, 2, 2), (3, 2, 3), (1, 2, 0), (1, 1, 0), (2, 1, 1), (3, 4, 3)],
                         ids=["zero1_long", "zero2_long", "zero3", "zero1_to_zero0_long", "zero1_to_one_zero0",
                              "zero2_to_one_long", "zero3_to_four_long"])
def test_deepspeed_continues_our_run(stage, world, their_stage, our_run, tmp_path):
    """`dscpp convert --to deepspeed` writes DeepSpeed's universal checkpoint (or, for a run without ZeRO, its ZeRO-0
    layout: `--zero_stage 0`); real DeepSpeed loads it ("load_universal") and continues: at the saving world size
    like our own run's steps 4-6, at another like our continuation at that layout (ZeRO 0 on one process, ZeRO 3 on
    four) from our checkpoint."""
    ckpt, ours = our_run(stage)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed", *(["--zero_stage", "0"] if their_stage == 0 else []))
    their_config = config(their_stage, universal=their_stage > 0)
    theirs = run_script("deepspeed", ["train_script.py", "--config", write_config(tmp_path, their_config, "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written)], world=world)
    if world != 2:
        ours = [None] * SAVE_AT + continue_ours(ckpt, 0 if world == 1 else stage, world, tmp_path)
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT)


@pytest.mark.parametrize("stage,world,model",
                         [(1, 2, ()), (2, 2, ()), (3, 2, ("--model", "batchnorm", "--eval", "--freeze", "fc1.bias")),
                          (2, 1, ()), (3, 4, ()), (1, 3, ("--model", "batchnorm", "--eval"))],
                         ids=["zero1", "zero2_long", "zero3_buffers_frozen", "zero2_to_one_long", "zero3_to_four_long",
                              "zero1_to_three_buffers_long"])
def test_deepspeed_continues_our_run_from_its_own_zero_files(stage, world, model, our_run, tmp_path):
    """`dscpp convert --to deepspeed --zero_stage S --world_size W` writes the files DeepSpeed itself saves at ZeRO S
    on W ranks (each rank's partition of the flat buffers; at ZeRO 3 each rank's pieces, its model states with the
    buffers and its pieces of the frozen parameters); real DeepSpeed loads them without load_universal and continues
    like our own continuation at that layout."""
    ckpt, ours = our_run(stage, model=model)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed", "--zero_stage", str(stage), "--world_size", str(world))
    tag = written / f"global_step{SAVE_AT}"
    optimizer_files = sorted(f.name for f in tag.iterdir() if f.name.endswith("_optim_states.pt"))
    assert optimizer_files == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    theirs = run_script("deepspeed", ["train_script.py", "--config", write_config(tmp_path, config(stage), "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written), *model], world=world)
    if world != 2:
        ours = [None] * SAVE_AT + continue_ours(ckpt, stage, world, tmp_path, model=model)
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT)


@pytest.mark.parametrize("stage", [2, 3], ids=["zero2_long", "zero3"])
def test_deepspeeds_zero_to_fp32_reads_its_own_zero_files_as_our_weights(stage, our_run, tmp_path):
    """DeepSpeed's own tool reads the files as DeepSpeed's: zero_to_fp32 on our ZeRO 2 / 3 files for 3 ranks (uneven
    partitions, padding on the last; the ZeRO-3 run is the one test_deepspeed_continues_our_run_from_its_own_zero_files
    converts too) assembles exactly the state dict `dscpp consolidate` writes — every trainable
    parameter from the partitions and param_shapes, the frozen one from its fragments, the buffers from the module."""
    model = ("--model", "batchnorm", "--eval", "--freeze", "fc1.bias")
    ckpt, _ = our_run(stage, model=model)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed", "--zero_stage", str(stage), "--world_size", "3")
    out = tmp_path / "zero_to_fp32.pt"
    subprocess.run([sys.executable, "-c", "import sys, torch\n"
                    "from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint as whole\n"
                    "torch.save(dict(whole(sys.argv[1])), sys.argv[2])", str(written), str(out)],
                   check=True, capture_output=True, cwd=HERE, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    theirs = torch.load(out, weights_only=True)
    subprocess.run([DSCPP, "consolidate", str(ckpt), str(tmp_path / "weights")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "weights" / "model.safetensors"))
    assert sorted(theirs) == sorted(ours)
    for name, value in ours.items():
        assert torch.equal(theirs[name], value), name


def test_deepspeed_continues_our_bf16_run_from_its_zero2_files_long(our_run, tmp_path):
    """A bf16 run's ZeRO-2 files: bf16_-prefixed optimizer files (the name DeepSpeed's bf16 load asks for), the module
    in bf16 (the rounding of the masters DeepSpeed starts from); its continuation follows ours within a few bf16 steps
    (test_training.py's bound), the first loss equal."""
    ckpt, ours = our_run(2, bf16=True)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed", "--zero_stage", "2")
    assert (written / f"global_step{SAVE_AT}" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").exists()
    theirs = run_script("deepspeed", ["train_script.py", "--config",
                                      write_config(tmp_path, config(2, bf16=True), "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written)], world=2)
    assert theirs[0]["loss"] == ours[SAVE_AT]["loss"]
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT, tol=2e-2)


def test_a_zero_stage_outside_deepspeeds_is_refused(our_run, tmp_path):
    ckpt, _ = our_run(1)
    for flags, named in ((["--zero_stage", "4"], "--zero_stage"), (["--world_size", "2"], "--world_size"),
                         (["--zero_stage", "1", "--world_size", "0"], "--world_size")):
        result = subprocess.run([DSCPP, "convert", "--to", "deepspeed", *flags, str(ckpt), str(tmp_path / "out")],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and named in result.stderr, (flags, result.stderr)
        assert not (tmp_path / "out").exists()


def test_our_checkpoint_through_deepspeeds_layout_and_back_is_bit_for_bit(our_run, tmp_path):
    """Ours (2 ranks' fragments) → DeepSpeed's universal files → ours again (one file): the master weights are those
    `dscpp consolidate` assembles from the original, and the per-parameter files are plain tensors that torch.load
    reads with weights_only=True."""
    ckpt, _ = our_run(1)
    universal = to_deepspeed(ckpt, tmp_path / "deepspeed")
    back = converted(universal, tmp_path / "back")
    subprocess.run([DSCPP, "consolidate", str(ckpt), str(tmp_path / "weights")], check=True, capture_output=True)
    weights = load_file(str(tmp_path / "weights" / "model.safetensors"))
    assert sorted("master/" + name for name in weights) == sorted(k for k in back if k.startswith("master/"))
    for name, value in weights.items():
        assert torch.equal(back["master/" + name], value.reshape(-1)), name
        for kind in ("fp32", "exp_avg", "exp_avg_sq"):
            saved = torch.load(universal / f"global_step{SAVE_AT}" / "zero" / name / f"{kind}.pt", weights_only=True)
            assert saved["param"].shape == value.shape
            assert torch.equal(back[("master" if kind == "fp32" else kind) + "/" + name], saved["param"].reshape(-1))


def test_buffers_go_to_deepspeeds_zero0_layout_and_stop_a_universal_export(our_run, tmp_path):
    """DeepSpeed's universal load restores trainable parameters only, so a model with buffers (BatchNorm's running
    statistics) is refused naming one; its ZeRO-0 layout carries them, and DeepSpeed's continuation, evaluating with
    them, follows ours."""
    model = ("--model", "batchnorm", "--eval")
    ckpt, ours = our_run(1, model=model)
    refused = subprocess.run([DSCPP, "convert", "--to", "deepspeed", str(ckpt), str(tmp_path / "universal")],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "buffer 'norm.running_mean'" in refused.stderr, refused.stderr
    assert not (tmp_path / "universal" / f"global_step{SAVE_AT}").exists()
    written = to_deepspeed(ckpt, tmp_path / "zero0", "--zero_stage", "0")
    theirs = run_script("deepspeed", ["train_script.py", "--config", write_config(tmp_path, config(0), "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written), *model], world=2)
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT)


@pytest.mark.parametrize("their_stage", [1, 0], ids=["universal_long", "zero0_long"])
def test_one_cycles_momentum_carries_over_long(their_stage, our_run, tmp_path):
    """OneCycle sets Adam's betas every step and DeepSpeed's load restores only its position: the files carry the
    betas of the next step (universal: every group's entry; ZeRO 0: the group), so DeepSpeed's first step after the
    load uses them, as ours does."""
    ckpt, ours = our_run(1, scheduler=ONE_CYCLE)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed", *(["--zero_stage", "0"] if their_stage == 0 else []))
    their_config = config(their_stage, universal=their_stage > 0, scheduler=ONE_CYCLE)
    theirs = run_script("deepspeed", ["train_script.py", "--config", write_config(tmp_path, their_config, "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written)], world=2)
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT)


def test_deepspeed_continues_our_bf16_run_long(our_run, tmp_path):
    """A bf16 run's universal checkpoint (fp32 masters and moments, as always): DeepSpeed's bf16 ZeRO-2 continuation
    starts from the same bf16 rounding of the same masters (its first step's loss equal) and follows within a few
    bf16 steps, as every bf16 comparison with DeepSpeed (test_training.py's bound)."""
    ckpt, ours = our_run(2, bf16=True)
    written = to_deepspeed(ckpt, tmp_path / "deepspeed")
    their_config = config(2, universal=True, bf16=True)
    theirs = run_script("deepspeed", ["train_script.py", "--config", write_config(tmp_path, their_config, "theirs.json"),
                                      "--steps", str(STEPS - SAVE_AT), "--load_dir", str(written)], world=2)
    assert theirs[0]["loss"] == ours[SAVE_AT]["loss"]
    assert_same_steps(ours[SAVE_AT:], theirs, STEPS - SAVE_AT, tol=2e-2)
