"""bench/generation (run.sh), part 3: tokens/s of ZeRO-Inference (ZeRO-3 without an optimizer, blocks released as
their forward ends) with the weights on NVMe (offload_param nvme, streamed block by block ahead of their gathers)
against the same with the weights in memory, 2 processes, interleaved over ROUNDS rounds in one job. Rank 0 prints
each one's tokens/s per round and the ratio of the medians.

    dscpp launch --num_gpus 2 bench/generation/zero_inference.py --nvme_path DIR
"""
import argparse
import statistics
import time

import torch

import dscpp
import llama  # bench/generation/llama.py: the shared model

p = argparse.ArgumentParser()
p.add_argument("--nvme_path", required=True)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--new_tokens", type=int, default=16)
llama.add_arguments(p)
args = p.parse_args()

dscpp.init_distributed(dist_backend="gloo")
engines = {}
for where in ("memory", "nvme"):
    model = llama.make(args)
    zero = {"stage": 3, "stage3_max_live_parameters": 1, "stage3_max_reuse_distance": 0}
    if where == "nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_path}
    engines[where] = dscpp.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1,
                                                            "zero_optimization": zero})[0]
prompt = torch.randint(1, llama.VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))


def tokens_per_second(where):
    start = time.perf_counter()
    with torch.no_grad():
        out = engines[where].module.generate(input_ids=prompt, max_new_tokens=args.new_tokens,
                                             min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start)


for where in engines:
    tokens_per_second(where)  # warm-up, and ZeRO-3 records its gather order
rates = {where: [] for where in engines}
for _ in range(args.rounds):
    for where in engines:
        rates[where].append(tokens_per_second(where))
if dscpp.comm.get_rank() == 0:
    print(f"zero_inference: {dscpp.comm.get_world_size()} processes, batch 1, {args.new_tokens} new tokens")
    for where, values in rates.items():
        print(f"  {where:6s} tokens/s " + " / ".join(f"{v:.2f}" for v in sorted(values)))
    ratio = statistics.median(rates["nvme"]) / statistics.median(rates["memory"])
    print(f"  nvme / memory tokens/s (medians): {ratio:.3f}x")
