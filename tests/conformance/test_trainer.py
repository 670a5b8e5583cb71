"""The Hugging Face Trainer's DeepSpeed path (issue 50): the same Trainer script (trainer_script.py: the Trainer's own
"auto" ZeRO configs, AdamW + WarmupDecayLR from the config, gradient accumulation 2, clipping, checkpoints every 3
steps, save_model at the end) on real DeepSpeed and, unchanged, on ours through python/deepspeed-compat. Per step the
loss and gradient norm the Trainer logs agree within 1e-5 and the lr exactly; the weights save_model wrote agree; and
a second job that resumes from the step-3 checkpoint (resume_from_checkpoint: the engine's checkpoint, the Trainer's
RNG and state files) logs steps 4-6 exactly as the uninterrupted run did.
- a LLaMA-style model at ZeRO-2;
- a GPT-2-style model (its head tied to the embedding) at ZeRO-3, saved by save_pretrained and loaded by
  from_pretrained under zero.Init (the config's model-dependent keys still "auto" then; the weights written through
  GatheredParameters(modifier_rank=0)), its vocabulary grown by resize_token_embeddings, evaluated every 3 steps (the
  Trainer calls the model itself, outside the engine, under no_grad), saved through
  _zero3_consolidated_16bit_state_dict;
- TRL's SFTTrainer (its SFTConfig, a pre-tokenized dataset) on the LLaMA-style model at ZeRO-3, where its fused loss
  reads the head's weight outside the head's forward and asks its ds_status (dscpp/zero/parameter.py), resumed too;
- TRL's DPOTrainer at ZeRO-2 with a reference model, which TRL makes a second engine of (initialize without an
  optimizer, its config's bucket sizes still "auto", at stage 0) and runs forward only; its config has no
  "scheduler", so the Trainer's linear schedule is made by initialize from the engine's optimizer;
- TRL's GRPOTrainer at ZeRO-3 (four sampled completions per prompt, a reward function): each step's completions are
  generated inside TRL's unwrap_model_for_generation, which gathers the model whole, takes the engine's hooks off
  through engine.optimizer.parameter_offload, calls generate() on the plain module and puts the hooks back
  (dscpp/zero/parameter_offload.py); the mean reward per step agrees too (the same completions), and it resumes."""
import json
import os
import shutil

import pytest

from conftest import HERE, LOSS_TOL, _run_ranks, install_deepspeed_name

STEPS = 6


@pytest.fixture(scope="module")
def deepspeed_name(tmp_path_factory):
    return install_deepspeed_name(tmp_path_factory.mktemp("deepspeed_name"))


def trainer_run(args, monkeypatch, name=None):
    """trainer_script.py on one process with torchrun's environment; (step records, saved-weight digest)."""
    with monkeypatch.context() as m:
        if name:
            m.setenv("PYTHONPATH", os.pathsep.join([name, os.environ.get("PYTHONPATH", "")]))
        what = "ours" if name else "DeepSpeed"
        out = _run_ranks(1, ["trainer_script.py"] + args, timeout=600, cwd=HERE, what=what)[0]
    assert ("[deepspeed.cpp] ZeRO stage" in out) == bool(name), f"{what}:\n{out[-3000:]}"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"')]
    evals = [r for r in lines if "eval_step" in r]
    return [r for r in lines if "step" in r], next(r["saved"] for r in lines if "saved" in r), evals


def assert_same_steps(ours, theirs, first, last):
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == list(range(first, last + 1)), (ours, theirs)
    for a, b in zip(ours, theirs):
        assert a["lr"] == b["lr"], (a, b)
        assert a["loss"] == pytest.approx(b["loss"], abs=LOSS_TOL, rel=0), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=LOSS_TOL, rel=0), (a, b)
        if b["reward"] is not None:  # GRPO: the same completions sampled
            assert a["reward"] == pytest.approx(b["reward"], abs=LOSS_TOL, rel=0), (a, b)


@pytest.mark.parametrize("trainer,model,stage,resume", [("hf", "llama", 2, True), ("hf", "gpt2", 3, True),
                                                       ("sft", "llama", 3, False), ("dpo", "llama", 2, False),
                                                       ("grpo", "llama", 3, True)])
def test_the_trainer_follows_real_deepspeed_and_resumes_exactly(trainer, model, stage, resume, deepspeed_name,
                                                                monkeypatch, tmp_path):
    args = ["--trainer", trainer, "--model", model, "--zero_stage", str(stage), "--max_steps", str(STEPS),
            "--save_steps", "3"]
    evaluates = trainer == "hf" and stage == 3
    if evaluates:  # and loads the model with from_pretrained under zero.Init, then resizes its embeddings
        args += ["--eval", "--pretrained"]
    if trainer == "dpo":  # the Trainer's own schedule, made by initialize from the engine's optimizer
        args.append("--no_config_scheduler")
    theirs, their_weights, their_evals = trainer_run(args + ["--out", str(tmp_path / "theirs")], monkeypatch)
    out = tmp_path / "ours"
    ours, our_weights, our_evals = trainer_run(args + ["--out", str(out)], monkeypatch, deepspeed_name)
    assert_same_steps(ours, theirs, 1, STEPS)
    # At ZeRO-3 the Trainer evaluates by calling the model itself, outside the engine (every 3 steps).
    assert [r["eval_step"] for r in our_evals] == [r["eval_step"] for r in their_evals] == ([3, 6] if evaluates
                                                                                             else [])
    for a, b in zip(our_evals, their_evals):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], abs=LOSS_TOL, rel=0), (a, b)
    # save_model's weights (their sums per tensor: the same names, the same values within the steps' tolerance)
    assert sorted(our_weights) == sorted(their_weights)
    for key in their_weights:
        assert our_weights[key] == pytest.approx(their_weights[key], abs=1e-4, rel=0), key
    # The Trainer's checkpoint folder: its files around the engine's global_step3/ and `latest`.
    assert {"global_step3", "latest", "trainer_state.json", "rng_state.pth"} <= set(os.listdir(out / "checkpoint-3"))
    if not resume:
        return
    shutil.rmtree(out / "checkpoint-6")  # as if the job had stopped before its last save: it resumes from step 3
    resumed, resumed_weights, _ = trainer_run(args + ["--out", str(out), "--resume"], monkeypatch, deepspeed_name)
    assert resumed == ours[3:]  # exactly: the same engine continuing the same state
    assert resumed_weights == our_weights
