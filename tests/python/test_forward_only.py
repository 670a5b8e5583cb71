"""Engines built without an optimizer (initialize(model, config) with no optimizer= and no "optimizer" section): forward
only, as DeepSpeed's — TRL's reference model, the Trainer's evaluation, ZeRO-Inference. What they hold, what they
refuse, and a training run's checkpoint loaded into them."""
import copy

import pytest
import torch

import dscpp
from models import TiedModel


@pytest.mark.parametrize("stage", [0, 3])
def test_without_an_optimizer_the_engine_runs_forward_only(stage):
    """initialize(model, config) with no optimizer and no "optimizer" section (TRL's reference model): the optimizer
    returned is None, the forward gives the module's own outputs (ZeRO-3: partitioned, gathered per forward), and
    backward and step are refused naming why; a "scheduler" section with nothing to schedule is an error."""
    torch.manual_seed(4)
    model = TiedModel()
    plain = copy.deepcopy(model).eval()
    engine, optimizer, _, scheduler = dscpp.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 6, "zero_optimization": {"stage": stage}})
    assert optimizer is None and scheduler is None and engine.optimizer is None
    assert "optimizer" not in engine.config
    engine.eval()
    ids = torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(engine(ids), plain(ids))
    loss = engine(ids)
    with pytest.raises(RuntimeError, match="initialized without an optimizer"):
        engine.backward(loss)
    with pytest.raises(RuntimeError, match="initialized without an optimizer"):
        engine.step()
    with pytest.raises(ValueError, match="no optimizer for it to schedule"):
        dscpp.initialize(model=TiedModel(), config={"train_micro_batch_size_per_gpu": 6, "scheduler": {
            "type": "WarmupLR", "params": {"warmup_num_steps": 2}}})
    with pytest.raises(ValueError, match="no optimizer for it to schedule"):
        dscpp.initialize(model=TiedModel(), config={"train_micro_batch_size_per_gpu": 6},
                         lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_forward_only_engine_holds_only_the_weights_and_loads_a_trained_checkpoint(stage, tmp_path):
    """TRL's reference model (stage 0 below ZeRO-3) and the Trainer's evaluation from a checkpoint: an engine
    initialized without an optimizer holds the weights in the compute dtype and nothing for training — no gradient
    buffer, fp32 master or optimizer state — and load_checkpoint puts a training run's trained weights into it (each
    its fp32 master rounded, as the training run's own weights are): its outputs are the trained engine's, bit for
    bit."""
    config = {"train_micro_batch_size_per_gpu": 6, "bf16": {"enabled": True}}
    torch.manual_seed(4)
    training, _, _, _ = dscpp.initialize(model=TiedModel(), config={
        **config, "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
    ids = torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        training.backward(training(ids))
        training.step()
    training.save_checkpoint(str(tmp_path))
    training.eval()
    with torch.no_grad():
        want = training(ids)
    training.destroy()

    torch.manual_seed(5)  # other values: every weight must come from the checkpoint
    model = TiedModel()
    whole = sum(p.numel() * 2 for p in model.parameters())  # bf16, the tied weight once
    engine, optimizer, _, _ = dscpp.initialize(model=model, config={**config, "zero_optimization": {"stage": stage}})
    assert optimizer is None
    memory = engine.memory()
    assert memory["grads"] + memory["master"] + memory["optimizer_state"] <= 16, memory  # the empty layout's padding
    if stage < 3:
        assert memory["frozen"] == whole and memory["params"] <= whole + 16, memory
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    engine.load_checkpoint(str(tmp_path))
    assert engine.global_steps == 3
    engine.eval()
    with torch.no_grad():
        got = engine(ids)
    assert torch.equal(got, want), (got, want)
