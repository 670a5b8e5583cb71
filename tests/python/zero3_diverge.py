"""A rank of test_zero3.py's divergence test: Quirky under ZeRO-3 where, on step 2, rank 1 skips the branch that
rank 0 runs. Writes the step at which the engine raised and its message."""
import json
import sys

import torch

import dscpp
from models import make_model
from training import ds_config


def main():
    out = sys.argv[1]
    model = make_model("quirky")
    engine, *_ = dscpp.initialize(model=model, config=ds_config(stage=3, grad_accum=1, world=2))
    rank = engine._engine.rank
    g = torch.Generator().manual_seed(rank)
    seen = {"step": None, "message": ""}
    for step in range(4):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        use_branch = torch.tensor([not (step == 2 and rank == 1)])
        try:
            engine.backward(engine(x, y, use_branch))
            engine.step()
        except RuntimeError as e:
            seen = {"step": step, "message": str(e)}
            break
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
