"""examples/python/rlhf_ppo.py (issue 54): DeepSpeed-Chat's step 3 on 2 processes — the actor on the hybrid engine at
ZeRO-3, the critic at ZeRO-3, the reference and reward models forward-only at ZeRO-3 — gives, iteration by
iteration, the losses and rewards of the same PPO loop in plain PyTorch on one process over both ranks' prompts."""
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, run_ranks

EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "rlhf_ppo.py")


def lines(output):
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"iteration"')]


def test_ppo_on_engines_equals_the_plain_pytorch_loop():
    ours = lines(run_ranks(2, [EXAMPLE, "--iterations", "4"])[0])
    reference = subprocess.run([sys.executable, EXAMPLE, "--reference", "--iterations", "4"], capture_output=True,
                               text=True, timeout=300, check=True)
    theirs = lines(reference.stdout)
    assert [r["iteration"] for r in ours] == [0, 1, 2, 3] and len(theirs) == 4, (ours, reference.stdout)
    for a, b in zip(ours, theirs):
        for key in ("actor_loss", "critic_loss", "reward"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (key, a, b)
    # The policy moved: the losses are not one number repeated.
    assert len({round(r["actor_loss"], 6) for r in ours}) == 4
