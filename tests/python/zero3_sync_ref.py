"""A rank of test_zero3.py's two-engine GatheredParameters test (TRL's SyncRefModelCallback): a bf16 ZeRO-3 policy
and its forward-only reference engine gathered together with modifier_rank=0; rank 0 mixes the policy into the
reference. Writes what it saw: the reference's new values on every rank, and whether the policy (left as it was)
then steps exactly as its twin that never went through the context (its fp32 master kept bit for bit)."""
import copy
import json
import sys

import torch

import dscpp
from models import make_model
from training import ds_config

ALPHA = 0.25


def main():
    out = sys.argv[1]
    config = ds_config(stage=3, grad_accum=1, world=2, dtype="bf16")
    base = make_model("gpt")
    policy, *_ = dscpp.initialize(model=copy.deepcopy(base), config=config)
    twin, *_ = dscpp.initialize(model=copy.deepcopy(base), config=config)
    reference_config = {k: v for k, v in config.items() if k != "optimizer"}
    reference, *_ = dscpp.initialize(model=make_model("gpt"), config=reference_config)  # other weights
    rank = policy._engine.rank
    tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(rank))
    for engine in (policy, twin):  # a step first: the fp32 masters now hold more than their bf16 values show
        engine.backward(engine(tokens))
        engine.step()

    seen = {}
    weight = reference.module.blocks[0].fc.weight
    with dscpp.zero.GatheredParameters(list(policy.module.parameters()) + list(reference.module.parameters()),
                                       modifier_rank=0):
        if rank == 0:
            for target, source in zip(reference.module.parameters(), policy.module.parameters()):
                target.data.mul_(1.0 - ALPHA).add_(source.data, alpha=ALPHA)
            seen["mixed"] = float(weight.double().sum())
    with dscpp.zero.GatheredParameters(weight):
        seen["reference_after"] = float(weight.double().sum())
    for engine in (policy, twin):
        engine.backward(engine(tokens))
        engine.step()
    with dscpp.zero.GatheredParameters(list(policy.module.parameters()) + list(twin.module.parameters())):
        seen["policy_equals_twin"] = all(torch.equal(a, b) for a, b in zip(policy.module.parameters(),
                                                                          twin.module.parameters()))
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
