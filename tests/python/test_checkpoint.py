"""Checkpoints are one format across the front ends: examples/python/train_gpt.py and the C++ gpt-train give the same
losses from the same weights and data, and a run saved by either resumes in the other — across world size and ZeRO
stage — ending where an uninterrupted run ends. Also: a Python save/load round trip continues bit for bit."""
import json
import os
import subprocess

import pytest
import torch

import dscpp
from conftest import HERE, run_ranks
from models import make_model
from training import ds_config

ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_gpt.py")
GPT_TRAIN = os.path.join(os.environ.get("DSCPP_BINARY_DIR", os.path.join(ROOT, "build")), "gpt-train")


def gpt_config(tmp_path, stage):
    path = tmp_path / f"stage{stage}.json"
    path.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
                                "zero_optimization": {"stage": stage},
                                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}}))
    return str(path)


def losses(metrics):
    return [json.loads(line)["loss"] for line in open(metrics)]


def run_gpt_train(config, steps, metrics, *extra):
    subprocess.run([GPT_TRAIN, "--model", "tiny", "--seq_len", "32", "--steps", str(steps), "--deepspeed_config",
                    config, "--metrics", str(metrics), "--no_progress", *extra], check=True, timeout=300,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))


def run_example(world, config, steps, metrics, *extra):
    run_ranks(world, [EXAMPLE, "--model", "tiny", "--seq_len", "32", "--steps", str(steps), "--deepspeed_config",
                      config, "--metrics", str(metrics), *extra])


def test_the_python_gpt_gives_gpt_trains_losses(tmp_path):
    config = gpt_config(tmp_path, 0)
    run_gpt_train(config, 3, tmp_path / "cpp.jsonl")
    run_example(1, config, 3, tmp_path / "py.jsonl")
    assert losses(tmp_path / "py.jsonl") == pytest.approx(losses(tmp_path / "cpp.jsonl"), abs=1e-5)


def test_python_to_cpp_to_python_across_world_size_and_stage(tmp_path):
    uninterrupted = tmp_path / "whole.jsonl"
    run_gpt_train(gpt_config(tmp_path, 0), 6, uninterrupted)
    ckpt = str(tmp_path / "ckpt")
    # Python, 2 ranks, ZeRO-3 → gpt-train, 1 rank, stage 0 → Python, 1 rank, ZeRO-2.
    run_example(2, gpt_config(tmp_path, 3), 2, tmp_path / "a.jsonl", "--save_dir", ckpt)
    run_gpt_train(gpt_config(tmp_path, 0), 4, tmp_path / "b.jsonl", "--load_dir", ckpt, "--save_dir", ckpt)
    run_example(1, gpt_config(tmp_path, 2), 6, tmp_path / "c.jsonl", "--load_dir", ckpt)
    resumed = losses(tmp_path / "a.jsonl") + losses(tmp_path / "b.jsonl") + losses(tmp_path / "c.jsonl")
    assert resumed == pytest.approx(losses(uninterrupted), abs=1e-5)


def test_a_python_round_trip_continues_bit_for_bit(tmp_path):
    batches = [torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(s)) for s in range(4)]

    def run(engine, steps):
        out = []
        for b in steps:
            engine.backward(engine(b))
            engine.step()
            out.append(engine.last_step()["loss"])
        return out

    config = ds_config(stage=2, grad_accum=1, world=1)
    whole, *_ = dscpp.initialize(model=make_model("gpt"), config=config)
    expected = run(whole, batches)
    first, *_ = dscpp.initialize(model=make_model("gpt"), config=config)
    got = run(first, batches[:2])
    assert first.save_checkpoint(str(tmp_path), client_state={"epoch": 3})
    resumed, *_ = dscpp.initialize(model=make_model("gpt", seed=5), config=ds_config(stage=1, grad_accum=1, world=1))
    path, client_state = resumed.load_checkpoint(str(tmp_path))
    assert path == str(tmp_path / "global_step2") and client_state == {"epoch": 3}
    assert resumed.global_steps == 2
    got += run(resumed, batches[2:])
    assert got == expected


def test_a_client_optimizers_group_settings_come_back_with_the_checkpoint(tmp_path):
    # DeepSpeed's checkpoint holds the client optimizer's state_dict: a script that lowered the lr mid-run resumes at
    # the lowered lr, not at the one its new optimizer was built with (Accelerate's resume relies on it).
    batches = [torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(s)) for s in range(5)]
    config = ds_config(stage=2, grad_accum=1, world=1)
    config.pop("optimizer", None)

    def start():
        model = make_model("gpt")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
        engine, *_ = dscpp.initialize(model=model, optimizer=optimizer, config=config)
        return engine, optimizer

    def run(engine, optimizer, steps, lower_at=None):
        out = []
        for i in steps:
            if i == lower_at:
                optimizer.param_groups[0]["lr"] = 2.5e-4
            engine.backward(engine(batches[i]))
            engine.step()
            out.append(engine.last_step()["loss"])
        return out

    whole = run(*start(), range(5), lower_at=1)
    first, first_optimizer = start()
    got = run(first, first_optimizer, range(3), lower_at=1)
    first.save_checkpoint(str(tmp_path))
    resumed, resumed_optimizer = start()
    _, client_state = resumed.load_checkpoint(str(tmp_path))
    assert client_state == {}  # the settings are ours to carry, not the script's
    assert resumed_optimizer.param_groups[0]["lr"] == 2.5e-4 and resumed_optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    got += run(resumed, resumed_optimizer, range(3, 5))
    assert got == whole


def test_load_without_a_checkpoint_returns_none_and_a_corrupt_one_is_named(tmp_path):
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=ds_config(stage=0, grad_accum=1, world=1))
    with pytest.warns(UserWarning, match="unable to find latest"):
        assert engine.load_checkpoint(str(tmp_path)) == (None, None)
    engine.backward(engine(torch.randint(0, 64, (4, 16))))
    engine.step()
    engine.save_checkpoint(str(tmp_path))
    shard = tmp_path / "global_step1" / "rank0.safetensors"
    if not shard.exists():  # the shard's name is the format's; find it
        shard = next((tmp_path / "global_step1").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(dscpp.CheckpointError, match=shard.name):
        engine.load_checkpoint(str(tmp_path))
    with pytest.raises(TypeError, match="JSON-serialisable"):
        engine.save_checkpoint(str(tmp_path), client_state={"t": torch.zeros(1)})


@pytest.mark.parametrize("stage", [1, 3])
def test_load_options_as_deepspeeds(tmp_path, stage):
    """load_lr_scheduler_states=False: the checkpoint's step count, this engine's schedule (a new one starts its
    warmup over). load_module_only=True: the weights alone. load_module_strict=False: a model with a parameter the
    checkpoint lacks loads the rest. Each loaded engine's first loss is the saved run's next one (same weights)."""
    config = ds_config(stage=stage, grad_accum=1, world=1)
    config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                          "warmup_num_steps": 10}}
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))

    def step(engine):
        engine.backward(engine(batch))
        engine.step()
        return engine.last_step()["loss"]

    def fresh(model=None):
        return dscpp.initialize(model=model or make_model("gpt", seed=5), config=config)[0]

    saved = fresh(make_model("gpt"))
    lr_fresh = saved.get_lr()
    for _ in range(3):
        step(saved)
    saved.save_checkpoint(str(tmp_path))
    lr_saved = saved.get_lr()
    assert lr_saved != lr_fresh
    next_loss = step(saved)

    resumed = fresh()
    resumed.load_checkpoint(str(tmp_path))
    assert (resumed.global_steps, resumed.get_lr()) == (3, lr_saved)
    restarted = fresh()
    restarted.load_checkpoint(str(tmp_path), load_lr_scheduler_states=False)
    assert (restarted.global_steps, restarted.get_lr()) == (3, lr_fresh)
    weights_only = fresh()
    weights_only.load_checkpoint(str(tmp_path), load_module_only=True)
    assert (weights_only.global_steps, weights_only.get_lr()) == (0, lr_fresh)
    for engine in (resumed, restarted, weights_only):
        assert step(engine) == next_loss

    wider = make_model("gpt", seed=5)
    wider.extra = torch.nn.Parameter(torch.full((3,), 7.0))
    wider = fresh(wider)
    with pytest.raises(dscpp.CheckpointError, match="this model has parameter 'extra'.*load_module_strict"):
        wider.load_checkpoint(str(tmp_path))
    wider.load_checkpoint(str(tmp_path), load_module_strict=False)
    assert step(wider) == next_loss
    with pytest.raises(NotImplementedError, match="custom_load_fn"):
        wider.load_checkpoint(str(tmp_path), custom_load_fn=lambda src, dst: None)


@pytest.mark.parametrize("stage", [1, 3])
def test_buffers_and_frozen_parameters_travel_with_the_checkpoint(tmp_path, stage):
    """resnet18's BatchNorm running statistics and a frozen layer are in the checkpoint (rank 0's, as DeepSpeed's
    module state): a fresh engine of another seed loads them; exclude_frozen_parameters leaves the frozen layer's
    own values; save_latest=False leaves `latest` naming the tag it named. Under ZeRO-3 the frozen layer is
    partitioned too (as DeepSpeed's), so it is read whole through GatheredParameters."""
    from models import global_batches

    def conv1(model):
        with dscpp.zero.GatheredParameters([model.net.conv1.weight]):
            return model.net.conv1.weight.detach().clone()

    def build(seed):
        model = make_model("resnet", seed=seed)
        model.net.conv1.weight.requires_grad_(False)
        return model, dscpp.initialize(model=model, config=ds_config(stage=stage, grad_accum=1, world=1))[0]

    saved_model, saved = build(0)
    for images, labels in global_batches("resnet", 2, 4):
        saved.backward(saved(images, labels))
        saved.step()
    saved.save_checkpoint(str(tmp_path), tag="all")
    saved.save_checkpoint(str(tmp_path), tag="trained_only", exclude_frozen_parameters=True, save_latest=False)
    assert (tmp_path / "latest").read_text().strip() == "all"
    buffers = {n: b.clone() for n, b in saved_model.named_buffers()}
    frozen = conv1(saved_model)
    assert frozen.shape == (64, 3, 7, 7)
    if stage == 3:  # partitioned: no elements between uses, its whole shape on record
        assert saved_model.net.conv1.weight.numel() == 0
        assert saved_model.net.conv1.weight.ds_shape == (64, 3, 7, 7)
    assert buffers["net.bn1.num_batches_tracked"].item() == 2

    model, engine = build(5)
    assert not torch.equal(conv1(model), frozen)
    own_frozen = conv1(model)
    engine.load_checkpoint(str(tmp_path), tag="trained_only")
    assert torch.equal(conv1(model), own_frozen)
    engine.load_checkpoint(str(tmp_path))
    for name, b in model.named_buffers():
        assert torch.equal(b, buffers[name]), name
    assert torch.equal(conv1(model), frozen)


def test_buffers_saved_in_bf16_load_into_an_fp32_run(tmp_path):
    """A bf16 run keeps its buffers in bf16; an fp32 run resuming from it takes them converted, as the weights."""
    from models import global_batches
    saved_model = make_model("resnet")
    saved, *_ = dscpp.initialize(model=saved_model, config=ds_config(stage=2, grad_accum=1, world=1, dtype="bf16"))
    images, labels = global_batches("resnet", 1, 4)[0]
    saved.backward(saved(images.bfloat16(), labels))
    saved.step()
    saved.save_checkpoint(str(tmp_path))
    model = make_model("resnet", seed=5)
    engine, *_ = dscpp.initialize(model=model, config=ds_config(stage=2, grad_accum=1, world=1))
    engine.load_checkpoint(str(tmp_path))
    mean = model.net.bn1.running_mean
    assert mean.dtype == torch.float32
    assert torch.equal(mean, saved_model.net.bn1.running_mean.float())
    assert not torch.equal(mean, torch.zeros_like(mean))


def test_non_persistent_buffers_stay_out_of_the_checkpoint(tmp_path):
    """A buffer registered with persistent=False (a mask, a table the module rebuilds) is not saved, as the module's
    state_dict leaves it out, and a loading engine keeps its own."""
    def build(fill):
        model = make_model("resnet")
        model.net.register_buffer("table", torch.full((4,), fill), persistent=False)
        assert "net.table" not in model.state_dict()
        return model, dscpp.initialize(model=model, config=ds_config(stage=2, grad_accum=1, world=1))[0]

    _, saved = build(1.0)
    saved.save_checkpoint(str(tmp_path), tag="t")
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    names = {e["name"] for e in manifest["module_state"]}
    assert "net.bn1.running_mean" in names and "net.table" not in names
    model, engine = build(2.0)
    engine.load_checkpoint(str(tmp_path), tag="t")
    assert torch.equal(model.net.table, torch.full((4,), 2.0))
