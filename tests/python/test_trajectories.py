"""Training through dscpp gives a plain PyTorch loop's losses: every ZeRO stage, one and two ranks, with and without
gradient accumulation (fp32 within 1e-5), and bf16 near fp32 (1e-2). Under ZeRO-3 every module that owns parameters
is a unit gathered around its forward (tied, unused and shared parameters, a module called twice, a skipped branch);
ZeRO-3 with coarser units (set_z3_leaf_modules) trains the same."""
import json

import pytest

from conftest import run_ranks
from training import engine_losses, reference_losses

STEPS = 3


@pytest.mark.parametrize("kind", ["gpt", "resnet", "quirky"])
@pytest.mark.parametrize("grad_accum", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_rank_matches_plain_pytorch(kind, stage, grad_accum):
    expected = reference_losses(kind, grad_accum, 1, STEPS)
    got = engine_losses(kind, stage, grad_accum, 1, 0, STEPS)
    assert got == pytest.approx(expected, abs=1e-5), (got, expected)


@pytest.mark.parametrize("kind", ["gpt", "resnet", "quirky"])
@pytest.mark.parametrize("grad_accum", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_ranks_match_plain_pytorch(kind, stage, grad_accum, tmp_path):
    out = tmp_path / "losses.json"
    run_ranks(2, ["training.py", kind, str(stage), str(grad_accum), str(STEPS), "fp32", str(out)])
    got = json.loads(out.read_text())
    expected = reference_losses(kind, grad_accum, 2, STEPS)
    assert got == pytest.approx(expected, abs=1e-5), (got, expected)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_bf16_stays_near_fp32(stage):
    expected = reference_losses("gpt", 1, 1, STEPS)
    got = engine_losses("gpt", stage, 1, 1, 0, STEPS, dtype="bf16")
    assert got == pytest.approx(expected, abs=1e-2), (got, expected)


@pytest.mark.parametrize("kind", ["gpt", "quirky"])
def test_zero3_leaf_modules_train_the_same(kind):
    import dscpp
    import models
    expected = reference_losses(kind, 1, 1, STEPS)
    leaf = {"gpt": models.Block, "quirky": models.Quirky}[kind]
    got = engine_losses(kind, 3, 1, 1, 0, STEPS, prepare=lambda m: dscpp.utils.set_z3_leaf_modules(m, [leaf]))
    assert got == pytest.approx(expected, abs=1e-5), (got, expected)


@pytest.mark.parametrize("stage", [0, 3])
def test_activation_checkpointing_recomputes_and_trains_the_same(stage):
    import dscpp
    calls = []

    def counted(block, x):
        def run(y):
            calls.append(1)
            return block(y)
        return dscpp.checkpointing.checkpoint(run, x)

    def prepare(model):
        model.checkpoint = counted
    expected = reference_losses("gpt", 1, 1, STEPS)
    got = engine_losses("gpt", stage, 1, 1, 0, STEPS, prepare=prepare)
    assert got == pytest.approx(expected, abs=1e-5), (got, expected)
    assert len(calls) == 2 * 2 * STEPS  # two blocks, each run forward and again in backward, every step


@pytest.mark.parametrize("stage,offload", [(2, {"offload_optimizer": {"device": "cpu"}}),
                                           (3, {"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"},
                                                "offload_param": {"device": "nvme", "nvme_path": "NVME"}})])
def test_offload_from_python_trains_the_same(stage, offload, tmp_path):
    import json as _json
    offload = _json.loads(_json.dumps(offload).replace("NVME", str(tmp_path)))

    def configure(config):
        config["zero_optimization"].update(offload)
    expected = reference_losses("gpt", 2, 1, STEPS)
    got = engine_losses("gpt", stage, 2, 1, 0, STEPS, configure=configure)
    assert got == pytest.approx(expected, abs=1e-5), (got, expected)
