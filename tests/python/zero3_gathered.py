"""A rank of test_zero3.py's GatheredParameters test: reads whole parameters under ZeRO-3, lets rank 0 change one,
trains a step, and writes what it saw."""
import json
import sys

import torch

import dscpp
from models import make_model
from training import ds_config


def main():
    out = sys.argv[1]
    reference = make_model("gpt")
    model = make_model("gpt")
    engine, *_ = dscpp.initialize(model=model, config=ds_config(stage=3, grad_accum=1, world=2))
    rank = engine._engine.rank
    seen = {}
    weight = model.blocks[0].fc.weight
    with dscpp.zero.GatheredParameters([weight, model.ln_f.weight]):
        seen["shape"] = list(weight.shape)
        seen["equal_to_init"] = bool(torch.equal(weight, reference.blocks[0].fc.weight))
    seen["empty_after"] = weight.data.storage().size() == 0
    with dscpp.zero.GatheredParameters(weight, modifier_rank=0):
        if rank == 0:
            weight.data.fill_(0.25)
    with dscpp.zero.GatheredParameters(weight):
        seen["modified"] = bool((weight == 0.25).all())
    tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(tokens))
    engine.step()
    with dscpp.zero.GatheredParameters(weight):
        seen["trained_from_it"] = abs(float(weight.mean()) - 0.25) < 0.01 and not bool((weight == 0.25).all())
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
