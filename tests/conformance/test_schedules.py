"""LR schedules step as real DeepSpeed's do (issue 49 item 1): every schedule, with the config's optimizer and with a
client optimizer, one process, ZeRO-0, fp32 — the same script under both, compared step by step: the lr DeepSpeed's
engine.get_lr() reports after each step (and a client optimizer's param groups), and the losses, which move with the
lr each step actually ran at.

DeepSpeed's optimizer here is torch's AdamW ("torch_adam": true): its default on CPU, FusedAdam, is an op compiled at
first use, minutes on a fresh machine, with Adam's arithmetic either way.
"""
import pytest

from conftest import assert_same_steps, run_script, write_config

STEPS = 16

SCHEDULES = {
    "WarmupLR-log": {"type": "WarmupLR",
                     "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2, "warmup_num_steps": 5}},
    "WarmupLR-linear": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                       "warmup_num_steps": 5, "warmup_type": "linear"}},
    # No warmup_max_lr: WarmupLR warms up to the optimizer's lr.
    "WarmupLR-to-optimizer-lr": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_num_steps": 4}},
    # The getting-started case: 0 -> 1e-2 over 3 steps, 12 in all (and 4 past the end).
    "WarmupDecayLR": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                                          "warmup_num_steps": 3, "total_num_steps": 12}},
    "WarmupCosineLR": {"type": "WarmupCosineLR", "params": {"total_num_steps": 12, "warmup_num_steps": 3,
                                                            "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}},
    "OneCycle": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                "cycle_first_step_size": 3, "cycle_second_step_size": 4,
                                                "cycle_first_stair_count": 2, "decay_step_size": 2,
                                                "decay_lr_rate": 0.5, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
                                                "decay_mom_rate": 0.01}},
    "OneCycle-no-momentum": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                            "cycle_first_step_size": 4, "cycle_momentum": False}},
    "LRRangeTest": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 3,
                                                      "lr_range_test_step_rate": 0.5}},
    "LRRangeTest-staircase": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-3,
                                                                "lr_range_test_step_size": 3,
                                                                "lr_range_test_step_rate": 0.5,
                                                                "lr_range_test_staircase": True}},
}


def config(schedule, client_optimizer):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
         "zero_optimization": {"stage": 0}, "scheduler": SCHEDULES[schedule]}
    if client_optimizer is None:
        c["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}
    return c


@pytest.mark.parametrize("client_optimizer", [None, "adamw"], ids=["config_optimizer", "client_adamw"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_schedule_steps_as_deepspeeds(tmp_path, schedule, client_optimizer):
    path = write_config(tmp_path, config(schedule, client_optimizer))
    args = ["train_script.py", "--config", path, "--steps", str(STEPS)]
    if client_optimizer:
        args += ["--client_optimizer", client_optimizer]
    assert_same_steps(run_script("dscpp", args), run_script("deepspeed", args), STEPS)


# DeepSpeed's OneCycle writes "betas" into an SGD optimizer's groups, which torch's SGD never reads: its momentum
# stays what the script gave it, and the lr cycles.
def test_one_cycle_leaves_sgd_momentum_alone(tmp_path):
    path = write_config(tmp_path, config("OneCycle", "sgd"))
    args = ["train_script.py", "--config", path, "--steps", str(STEPS), "--client_optimizer", "sgd"]
    assert_same_steps(run_script("dscpp", args), run_script("deepspeed", args), STEPS)
