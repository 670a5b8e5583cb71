"""One rank of a compressed TinyLM's training (compression_models.every_technique, each switching on at its own
step during the run) through init_compression and dscpp.initialize at the given ZeRO stage, 6 steps over a global
batch of 8 split across the ranks, then redundancy_clean. Rank 0 writes to OUT the losses, the sum of the trained
weights' magnitudes, the cleaned model's shapes, and whether the cleaned model's outputs equal the compressed one's.

    python3 compression_train.py STAGE OUT      (torchrun's environment)
"""
import json
import sys

import torch
import torch.distributed as dist

import dscpp
from compression_models import TinyLM, batch, ds_config, every_technique
from dscpp.compression import init_compression, redundancy_clean

GLOBAL_BATCH = 8


def main():
    stage, out = int(sys.argv[1]), sys.argv[2]
    dscpp.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    compression = every_technique(weight_bits=4)
    for name, offset in {"weight_quantization": 1, "sparse_pruning": 2, "row_pruning": 3, "head_pruning": 2,
                         "activation_quantization": 4}.items():
        compression[name]["shared_parameters"]["schedule_offset"] = offset
    torch.manual_seed(0)
    model = TinyLM()
    config = ds_config(compression, stage=stage, micro=GLOBAL_BATCH // world)
    init_compression(model, config)
    engine, *_ = dscpp.initialize(model=model, config=config)
    losses = []
    for step in range(6):
        inputs, targets = batch(step, GLOBAL_BATCH)
        mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        loss = engine(inputs[mine], targets[mine])
        engine.backward(loss)
        engine.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole)
        losses.append(whole.item() / world)
    weights = sum(float(p.detach().abs().sum()) for p in model.parameters())
    model.eval()
    ids, _ = batch(99, 2)
    with torch.no_grad():
        before = model(ids)
    redundancy_clean(model, config)
    with torch.no_grad():
        cleaned_equal = bool((model(ids) - before).abs().max() < 1e-6)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "cleaned_equal": cleaned_equal, "weights": weights,
                       "shapes": {n: list(p.shape) for n, p in model.named_parameters()}}, f)


if __name__ == "__main__":
    main()
