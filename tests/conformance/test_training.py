"""What a training script leans on besides the optimizer step, as real DeepSpeed does it: BatchNorm's running
statistics (buffers each rank keeps) and eval(); save_checkpoint with client state and a second job that resumes from
it; bf16; DeepSpeed-MoE's top-1 and top-2 gates dropping tokens, with and without Random Token Selection, at expert
parallelism 1 and 2. Each case: the same script (train_script.py) and config under both engines, compared per step."""
import pytest

from conftest import assert_same_steps, run_script, write_config

ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}


def config(stage, gas=1, **extra):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
         "gradient_clipping": 1.0, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
         "optimizer": ADAMW}
    c.update(extra)
    return c


def both(tmp_path, cfg, script_args, world):
    args = ["train_script.py", "--config", write_config(tmp_path, cfg)] + script_args
    return run_script("dscpp", args, world=world), run_script("deepspeed", args, world=world)


@pytest.mark.parametrize("stage", [0, 3], ids=lambda s: f"stage{s}")
def test_batchnorm_buffers_and_eval(tmp_path, stage):
    ours, theirs = both(tmp_path, config(stage), ["--model", "batchnorm", "--eval", "--steps", "6"], world=2)
    assert_same_steps(ours, theirs, 6)


@pytest.mark.parametrize("stage", [1, 3], ids=lambda s: f"stage{s}")
def test_checkpoint_with_client_state_resumes_in_a_second_job(tmp_path, stage):
    cfg = config(stage, gas=2, scheduler={"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 3, "total_num_steps": 10}})
    path = write_config(tmp_path, cfg)
    runs = {}
    for impl in ("dscpp", "deepspeed"):
        save = str(tmp_path / f"ckpt_{impl}")
        first = run_script(impl, ["train_script.py", "--config", path, "--steps", "8", "--save_dir", save,
                                  "--save_at", "4"], world=2)
        second = run_script(impl, ["train_script.py", "--config", path, "--steps", "4", "--load_dir", save], world=2)
        runs[impl] = first, second
    assert_same_steps(runs["dscpp"][0], runs["deepspeed"][0], 8)
    assert_same_steps(runs["dscpp"][1], runs["deepspeed"][1], 4)
    assert [r["step"] for r in runs["dscpp"][1]] == [5, 6, 7, 8]
    # The resumed job continues the saved one: its steps are the uninterrupted run's.
    assert_same_steps(runs["dscpp"][1], runs["deepspeed"][0][4:], 4)


# bf16 compute with fp32 master weights: the two engines round at the same places only up to the order of sums, and
# the loss itself is a bf16 number, so the bound is a few of bf16's steps (2^-8 relative: 2e-2 is five), not fp32's.
# Measured: step 2's loss 1.5390625 against 1.5234375 (two bf16 steps at 1.5), the gradient norms within 0.5%.
# Not at ZeRO-0 yet: there DeepSpeed wraps torch's AdamW in its FP16_UnfusedOptimizer over bf16, and the two runs
# drift apart (step 6's loss 0.9648 against 0.9375, the gradient norms 2% apart) where ZeRO-1/2 stay together: open.
@pytest.mark.parametrize("stage", [1, 2], ids=lambda s: f"stage{s}")
def test_bf16(tmp_path, stage):
    ours, theirs = both(tmp_path, config(stage, bf16={"enabled": True}), ["--steps", "6"], world=1)
    assert_same_steps(ours, theirs, 6, tol=2e-2)


@pytest.mark.parametrize("ep,world", [(1, 1), (2, 2)], ids=["ep1", "ep2"])
@pytest.mark.parametrize("k,use_rts", [(1, 0), (1, 1), (2, 0)], ids=["top1", "top1_rts", "top2"])  # RTS: top-1's
def test_moe_gate_drops_the_tokens_deepspeed_drops(tmp_path, k, use_rts, ep, world):
    # Without clipping: with experts spread over ranks, DeepSpeed's ZeRO-0 clips by the mean of the ranks' own norms
    # (runtime/utils.clip_grad_norm_), ours by the norm of the whole gradient, each expert counted once; the two
    # differ by design at ep 2 (at ep 1 they agree, and test_zero covers clipping).
    ours, theirs = both(tmp_path, config(0, gradient_clipping=0), ["--model", "moe", "--moe_k", str(k), "--moe_use_rts", str(use_rts),
                                              "--moe_ep", str(ep), "--steps", "6"], world=world)
    assert_same_steps(ours, theirs, 6)
