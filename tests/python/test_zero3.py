"""ZeRO-3 specifics from Python: GatheredParameters reads whole parameters on every rank and writes the modifier
rank's changes into every rank's shards; ranks that diverge stop with where each one was."""
import json

import pytest
import torch
import torch.utils.checkpoint

import dscpp
from conftest import run_ranks


def test_gathered_parameters_read_whole_and_write_from_the_modifier_rank_and_the_hooks_come_off(tmp_path):
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_gathered.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        # then TRL's unwrap_model_for_generation (the hooks off over the gathered model, then back): the same
        # output as the hooked model's, the hooks counted back (a pre-hook and a hook for each of the
        # model's 17 units, the bare forward's two), and a step after it
        assert seen == {"shape": [128, 32], "equal_to_init": True, "empty_after": True, "modified": True,
                        "trained_from_it": True, "hooks": 36, "hooks_back": 36, "external": [],
                        "plain_equals_hooked": True, "released": True, "steps": 2}, (rank, seen)


def test_gathered_parameters_of_two_engines_write_only_what_the_modifier_rank_changed(tmp_path):
    # TRL's SyncRefModelCallback under ZeRO-3 (bf16): a policy's and its reference's parameters gathered together;
    # rank 0 mixes the policy into the reference, which every rank then holds; the policy, unchanged, keeps its fp32
    # master bit for bit (a write of its bf16 values would round it): its next step equals its twin's.
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_sync_ref.py", str(out)])
    seen = [json.loads(open(f"{out}.{rank}").read()) for rank in range(2)]
    assert seen[0]["reference_after"] == seen[1]["reference_after"] == seen[0]["mixed"], seen
    assert seen[0]["policy_equals_twin"] and seen[1]["policy_equals_twin"], seen


def test_ranks_that_take_different_branches_stop_with_where_each_was(tmp_path):
    # Step 2: rank 1 skips the branch rank 0 runs. Both raise there (no hang, no crash), naming both ranks' points.
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_diverge.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        assert seen["step"] == 2, (rank, seen)
        assert "ZeRO-3: ranks disagree on the next collective" in seen["message"], (rank, seen)
        # Rank 1 went on to `out` (whose weight the forward reads outside its module) where rank 0 ran `branch`.
        assert "rank 0: demand #3 of micro-step 2 (branch)" in seen["message"], (rank, seen)
        assert "rank 1: demand #3 of micro-step 2 (out)" in seen["message"], (rank, seen)


class _LoraLayer(torch.nn.Module):
    """PEFT's LoRA layer shape: a frozen base_layer beside lora_A / lora_B (three ZeRO-3 units)."""

    def __init__(self):
        super().__init__()
        self.base_layer = torch.nn.Linear(16, 16)
        self.base_layer.requires_grad_(False)
        self.lora_A = torch.nn.Linear(16, 2, bias=False)
        self.lora_B = torch.nn.Linear(2, 16, bias=False)

    def forward(self, x):
        return torch.tanh(self.base_layer(x) + self.lora_B(self.lora_A(x)))


class _LoraNet(torch.nn.Module):
    def __init__(self, checkpointing):
        super().__init__()
        self.layers = torch.nn.ModuleList([_LoraLayer() for _ in range(3)])
        self.head = torch.nn.Linear(16, 1)
        self.checkpointing = checkpointing

    def forward(self, x):
        for layer in self.layers:
            if self.checkpointing is None:
                x = layer(x)
            else:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=self.checkpointing == "reentrant")
        return self.head(x).pow(2).mean()


def _train_lora(checkpointing):
    """3 steps of _LoraNet at ZeRO-3 on one process: the losses and the engine's memory report."""
    torch.manual_seed(0)
    model = _LoraNet(checkpointing)
    config = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}}
    engine, *_ = dscpp.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    losses = []
    for _ in range(3):
        loss = engine(x)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    return losses, engine.memory()


@pytest.mark.parametrize("checkpointing", [None, "reentrant", "non_reentrant"])
def test_frozen_bases_are_released_in_backward_under_torch_checkpoint(checkpointing):
    # A LoRA fine-tune at ZeRO-3 with the Hugging Face way of activation checkpointing: each frozen base is gathered
    # for its layer's forward and backward only. Non-reentrant checkpointing records a graph while it recomputes that
    # never runs: its nodes count as done when they go, or every base would stay gathered to the end of backward.
    layer_bytes = (16 * 16 + 16) * 4
    losses, memory = _train_lora(checkpointing)
    assert memory["frozen"] == 3 * layer_bytes, memory
    assert memory["gathered_peak"] <= layer_bytes + 64 * 4, memory  # one base (and the small adapters) at a time
    if checkpointing is not None:
        assert losses == _train_lora(None)[0]  # the same training as without checkpointing
