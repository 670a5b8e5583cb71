"""`dscpp launch` starts a Python script as DeepSpeed's launcher does (python -u SCRIPT --local_rank=N ARGS), and the
script's two ranks train as one gpt-train process with the same global batch."""
import os
import subprocess

import pytest

from conftest import free_port
from test_checkpoint import EXAMPLE, GPT_TRAIN, gpt_config, losses, run_gpt_train

DSCPP = os.path.join(os.path.dirname(GPT_TRAIN), "dscpp")


def test_dscpp_launch_runs_the_example_on_two_ranks(tmp_path):
    config = gpt_config(tmp_path, 2)
    run_gpt_train(config, 3, tmp_path / "cpp.jsonl")
    launched = subprocess.run([DSCPP, "launch", "--num_gpus", "2", "--master_port", str(free_port()), EXAMPLE,
                               "--model", "tiny", "--seq_len", "32", "--steps", "3", "--deepspeed_config", config,
                               "--metrics", str(tmp_path / "py.jsonl")],
                              env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert losses(tmp_path / "py.jsonl") == pytest.approx(losses(tmp_path / "cpp.jsonl"), abs=1e-5)


def test_a_script_that_does_not_exist_is_a_usage_error(tmp_path):
    launched = subprocess.run([DSCPP, "launch", "--num_gpus", "2", str(tmp_path / "missing.py")],
                              capture_output=True, text=True, timeout=60)
    assert launched.returncode == 2 and "missing.py' cannot be read" in launched.stderr, launched.stderr
