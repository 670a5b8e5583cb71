"""A rank of test_zero_init.py: a model built inside dscpp.zero.Init — each module cut down to this rank's shard
as it is built — holds no parameter memory before initialize, can be read and changed through GatheredParameters,
is initialised as the same model built whole (init code reading its weights, HF's post_init apply), and trains as
the plain PyTorch loop does, with DeepSpeed's units or coarser leaf units. Writes what it saw as JSON."""
import json
import os
import sys

import torch
import torch.nn as nn

import dscpp
from models import Block, TinyGpt, make_model
from training import ds_config, engine_losses

STEPS = 3


class HfStyle(TinyGpt):
    """Initialises its weights after construction as HF models do (post_init → self.apply(_init_weights))."""

    def __init__(self):
        super().__init__()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.05)
            if module.bias is not None:
                module.bias.data.fill_(0.01)


def whole_values(model):
    with dscpp.zero.GatheredParameters(list(model.parameters())):
        return {name: p.detach().clone() for name, p in model.named_parameters()}


def main():
    out = sys.argv[1]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    config = ds_config(stage=3, grad_accum=1, world=world)
    seen = {}

    # Built partitioned: nothing whole remains; this rank's shards are half the model (plus padding).
    torch.manual_seed(0)
    with dscpp.zero.Init(config_dict_or_path=config):
        model = HfStyle()
    seen["param_elements_after_build"] = sum(p.numel() for p in model.parameters())
    shards = sum(u.shard_numel for u in dscpp.zero.init.units_of(model))
    total = sum(p.numel() for p in make_model("gpt").parameters())  # the tied head counts once
    seen["shard_fraction"] = round(shards / total, 2)

    # Same values as the model built whole with the same seed (rank 0's draws), read before and after initialize.
    torch.manual_seed(0)
    reference = HfStyle()
    before = whole_values(model)
    seen["equal_before_initialize"] = all(torch.equal(before[n], p) for n, p in reference.named_parameters())
    engine, *_ = dscpp.initialize(model=model, config=config)
    after = whole_values(model)
    seen["equal_after_initialize"] = all(torch.equal(after[n], p) for n, p in reference.named_parameters())

    # Changed before initialize by the modifier rank; the engine trains from the change.
    torch.manual_seed(0)
    with dscpp.zero.Init(config_dict_or_path=config):
        changed = TinyGpt()
    weight = changed.blocks[1].fc.weight
    with dscpp.zero.GatheredParameters(weight, modifier_rank=0):
        seen["gathered_shape"] = list(weight.shape)
        if rank == 0:
            weight.data.fill_(0.25)
    seen["empty_again"] = weight.numel() == 0
    dscpp.initialize(model=changed, config=config)
    with dscpp.zero.GatheredParameters(weight):
        seen["modified"] = bool((weight == 0.25).all())

    # Training: DeepSpeed's units, and leaf units regrouped after construction.
    seen["losses"] = engine_losses("gpt", 3, 1, world, rank, STEPS, zero_init=True)
    seen["leaf_losses"] = engine_losses("gpt", 3, 1, world, rank, STEPS, zero_init=True,
                                        prepare=lambda m: dscpp.utils.set_z3_leaf_modules(m, [Block]))
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
