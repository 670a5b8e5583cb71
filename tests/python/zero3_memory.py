"""A rank of test_memory: trains the test GPT under ZeRO-3 and reports, between forwards, what its parameters hold —
measured on the tensors themselves (their storages' bytes) and as the engine accounts it — the most it held
gathered during the steps, and what reading the parameters then gives (0-element tensors, as DeepSpeed's)."""
import json
import sys

import torch

import dscpp
from models import make_model
from training import ds_config


def storage_bytes(module):
    seen, total = set(), 0
    for p in module.parameters():
        storage = p.data.storage()
        if storage.data_ptr() not in seen or storage.nbytes() == 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def main():
    out = sys.argv[1]
    model = make_model("gpt")
    if len(sys.argv) > 2 and sys.argv[2] == "lora":  # everything frozen but the layer norms, as a LoRA base is
        for name, p in model.named_parameters():
            p.requires_grad_(".ln" in name or name.startswith("ln"))
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    largest_unit = max(sum(p.numel() * p.element_size() for p in m._parameters.values() if p is not None)
                       for m in model.modules())
    config = ds_config(stage=3, grad_accum=1, world=2)
    # Gathered at once: at most this many elements beyond the unit being demanded.
    config["zero_optimization"].update(stage3_max_live_parameters=6000, stage3_prefetch_bucket_size=3000)
    engine, *_ = dscpp.initialize(model=model, config=config)
    rank = engine._engine.rank
    for step in range(2):
        tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(10 * step + rank))
        engine.backward(engine(tokens))
        engine.step()
    # Reads between forwards, the way scripts do them: a state_dict, a norm, an attribute.
    state = model.state_dict()
    read = {"state_dict_elements": sum(t.numel() for t in state.values()),
            "norm": float(sum(p.norm() for p in model.parameters())),
            "head_weight_shape": list(model.head.weight.shape)}
    report = {"whole": whole, "held": storage_bytes(model), "engine_params": engine.memory()["params"],
              "gathered_peak": engine.memory()["gathered_peak"], "largest_unit": largest_unit, "read": read,
              "frozen": frozen, "engine_frozen": engine.memory()["frozen"]}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
