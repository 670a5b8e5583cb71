"""ZeRO stages 0–3 on one and two processes, with and without gradient accumulation, step for step as real
DeepSpeed: the same script (train_script.py), config and data under both; fp32, AdamW (torch's, "torch_adam": true —
see test_schedules.py), gradient clipping on, a warmup schedule so the lr moves."""
import pytest

from conftest import assert_same_steps, run_script, write_config

STEPS = 8


@pytest.mark.parametrize("world,gas", [(1, 2), (2, 1), (2, 2)],
                         ids=["one_process_gas2", "two_processes_gas1", "two_processes_gas2"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3], ids=lambda s: f"stage{s}")
def test_zero_stage_steps_as_deepspeeds(tmp_path, stage, world, gas):
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
              "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                           "warmup_num_steps": 4}}}
    args = ["train_script.py", "--config", write_config(tmp_path, config), "--steps", str(STEPS)]
    assert_same_steps(run_script("dscpp", args, world=world), run_script("deepspeed", args, world=world), STEPS)


@pytest.mark.parametrize("world", [1, 2], ids=["lora_one_process", "lora_two_processes"])
def test_a_lora_fine_tune_at_zero3_steps_as_deepspeeds(tmp_path, world):
    # PEFT's layer shape (a frozen base_layer beside lora_A / lora_B), a frozen layer between, every parameter in
    # model_parameters as a LoRA script passes them. The frozen ones are partitioned, as DeepSpeed's are.
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
              "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}}
    args = ["train_script.py", "--config", write_config(tmp_path, config), "--steps", str(STEPS), "--model", "lora"]
    assert_same_steps(run_script("dscpp", args, world=world), run_script("deepspeed", args, world=world), STEPS)
