"""bench/generation (run.sh): tokens/s of generate() on a ZeRO-3 training engine — the hybrid engine, which gathers
every parameter once per call (hybrid_engine.pin_parameters), against gathering through ZeRO-3's hooks for every
forward (what a plain ZeRO-3 model does, pin_parameters false) — in one engine, interleaved over ROUNDS rounds, on
every rank of the job. Rank 0 prints each mode's tokens/s per round and the ratio of the medians.

    dscpp launch --num_gpus 2 bench/generation/generation.py [--rounds 3] [--new_tokens 32] [--layers 8]
"""
import argparse
import statistics
import time

import torch

import dscpp
import llama  # bench/generation/llama.py: the shared model

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--new_tokens", type=int, default=32)
p.add_argument("--batch", type=int, default=1)
llama.add_arguments(p)
args = p.parse_args()

dscpp.init_distributed(dist_backend="gloo")
model = llama.make(args)
elements = sum(p.numel() for p in model.parameters())
config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": 3}, "hybrid_engine": {"enabled": True}}
engine, _, _, _ = dscpp.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.eval()
prompt = torch.randint(1, llama.VOCAB, (args.batch, 16), generator=torch.Generator().manual_seed(1))


def tokens_per_second(pin):
    engine.gather_all_layers = pin  # pin_parameters, switched on the one engine
    start = time.perf_counter()
    out = engine.generate(input_ids=prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                          do_sample=False, pad_token_id=0)
    elapsed = time.perf_counter() - start
    return (out.shape[1] - prompt.shape[1]) * args.batch / elapsed


tokens_per_second(True)  # warm-up: first-call allocations, thread pools
rates = {"hybrid": [], "per_forward": []}
for _ in range(args.rounds):
    rates["hybrid"].append(tokens_per_second(True))
    rates["per_forward"].append(tokens_per_second(False))
if dscpp.comm.get_rank() == 0:
    print(f"generation: LLaMA-shaped, {elements / 1e6:.1f}M parameters, {dscpp.comm.get_world_size()} processes, "
          f"ZeRO-3, batch {args.batch}, prompt 16, {args.new_tokens} new tokens, {args.rounds} rounds")
    for mode, values in rates.items():
        print(f"  {mode:12s} tokens/s " + " / ".join(f"{v:.2f}" for v in sorted(values)))
    ratio = statistics.median(rates["hybrid"]) / statistics.median(rates["per_forward"])
    print(f"  hybrid / per_forward tokens/s (medians): {ratio:.2f}x (target >= 10)")
