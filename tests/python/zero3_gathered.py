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

    # TRL's unwrap_model_for_generation: the model gathered whole, the engine's hooks taken off through
    # engine.optimizer.parameter_offload, the model run as a plain module, the hooks put back.
    with torch.no_grad():
        hooked = model(tokens)  # the model called by itself: the engine's hooks gather it unit by unit
    offload = engine.optimizer.parameter_offload
    seen["hooks"] = len(offload.forward_hooks)
    with dscpp.zero.GatheredParameters(engine.parameters()):
        for p in offload.module.parameters():
            p.ds_active_sub_modules.clear()
        seen["external"] = list(offload.module.ds_external_parameters())
        for handle in offload.forward_hooks + offload.backward_hooks:
            handle.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        with torch.no_grad():
            seen["plain_equals_hooked"] = bool(torch.equal(model(tokens), hooked))
        offload._register_deepspeed_module(offload.module)
    seen["hooks_back"] = len(offload.forward_hooks)
    with torch.no_grad():
        seen["released"] = weight.numel() == 0  # the hooked forward after GatheredParameters: released again
    engine.backward(engine(tokens))  # the units are gathered by their hooks again (0-element otherwise)
    engine.step()
    seen["steps"] = engine.global_steps
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
