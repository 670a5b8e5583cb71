#!/usr/bin/env python3
"""Train gpt-train's GPT from Python the way a DeepSpeed script does — `import dscpp as deepspeed` is the only change.

    python examples/python/train_gpt.py --model tiny --steps 50        # with the package installed (pip install .)
    dscpp launch --num_gpus 2 examples/python/train_gpt.py --deepspeed_config ds.json --save_dir ckpt
    dscpp launch --num_gpus 2 examples/python/train_gpt.py --moe_experts 4 --moe_top_k 2 --ep_size 2
(From README command 1's build without installing: PYTHONPATH=build/python, and build/dscpp for dscpp.)

The model and data are gpt-train's (examples/python/gpt.py): the same weights from the same seed and the same rows
per rank, so the losses are gpt-train's and checkpoints move between the two in either direction.
"""
import argparse
import json
import os
import sys
import time

import torch

import dscpp as deepspeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import PRESETS, Gpt, load_tokens, rows  # noqa: E402

# Used without --deepspeed_config (train_batch_size follows from the micro-batch, accumulation and world size).
DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 10,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=50, help="total optimizer steps (a resumed run ends there too)")
    p.add_argument("--seq_len", type=int, help="tokens per row (default: the block size, at most 128)")
    p.add_argument("--data", help="a text file, read as bytes (default: gpt-train's embedded corpus's files)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save_dir", help="save a checkpoint here every --save_interval steps and at the end")
    p.add_argument("--save_interval", type=int, default=0)
    p.add_argument("--load_dir", help="resume from the checkpoint `latest` names here")
    p.add_argument("--metrics", help="rank 0 writes one JSON line per optimizer step here (step, loss: the mean over "
                                     "the global batch, lr, step_ms), as gpt-train's --metrics")
    p.add_argument("--no_progress", action="store_true", help="accepted for gpt-train's command lines")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the launcher (DeepSpeed's convention)")
    # Mixture of Experts in blocks 1, 3, … (dscpp.moe.layer.MoE), as gpt-train's flags of the same names.
    p.add_argument("--moe_experts", type=int, default=0, help="MoE: experts per MoE block (0: a dense GPT)")
    p.add_argument("--moe_top_k", type=int, default=1, help="MoE: experts per token, 1 or 2")
    p.add_argument("--ep_size", type=int, default=1, help="MoE: ranks each block's experts are spread over")
    p.add_argument("--moe_loss_coeff", type=float, default=0.01, help="MoE: the load-balancing loss's weight")
    p.add_argument("--moe_capacity_factor", type=float, default=1.0)
    p.add_argument("--moe_eval_capacity_factor", type=float, default=1.0)
    p.add_argument("--moe_min_capacity", type=int, default=4)
    for flag, default in (("drop_tokens", "true"), ("use_rts", "true"), ("use_residual", "false"),
                          ("top2_2nd_expert_sampling", "true")):
        p.add_argument(f"--moe_{flag}", choices=("true", "false"), default=default)
    p.add_argument("--moe_noisy_gate_policy", default="None", choices=("None", "Jitter", "RSample"))
    return deepspeed.add_config_arguments(p).parse_args()


def main():
    args = parse_args()
    deepspeed.init_distributed()  # torch.distributed too: dist.get_rank() works from here on
    n_layer, n_head, n_embd, block_size = PRESETS[args.model]
    seq_len = args.seq_len or min(block_size, 128)
    tokens = load_tokens(args.data, seq_len)
    moe = None
    if args.moe_experts:
        moe = dict(num_experts=args.moe_experts, ep_size=args.ep_size, k=args.moe_top_k,
                   capacity_factor=args.moe_capacity_factor, eval_capacity_factor=args.moe_eval_capacity_factor,
                   min_capacity=args.moe_min_capacity, noisy_gate_policy=args.moe_noisy_gate_policy,
                   **{name: getattr(args, f"moe_{name}") == "true"
                      for name in ("drop_tokens", "use_rts", "use_residual", "top2_2nd_expert_sampling")})
    torch.manual_seed(args.seed)
    model = Gpt(256, n_layer, n_head, n_embd, block_size, moe=moe, moe_loss_coeff=args.moe_loss_coeff)
    if args.deepspeed_config:  # DeepSpeed Compression, as a DeepSpeed script applies it (gpt-train: --compression)
        with open(args.deepspeed_config) as f:
            if json.load(f).get("compression_training"):
                from dscpp.compression import init_compression
                init_compression(model, args.deepspeed_config)

    engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                           config=None if args.deepspeed_config else DEFAULT_CONFIG)
    if args.load_dir:
        path, _ = engine.load_checkpoint(args.load_dir)
        if path is None:
            print(f"[train_gpt] no checkpoint in {args.load_dir} yet: starting fresh", flush=True)

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro, batch = engine.train_micro_batch_size_per_gpu(), engine.train_batch_size()
    rank_rows = batch // world
    metrics = open(args.metrics, "a") if args.metrics and rank == 0 else None
    loss = None
    while engine.global_steps < args.steps:
        step = engine.global_steps
        start = time.perf_counter()
        for k in range(engine.gradient_accumulation_steps()):
            inputs, targets = rows(tokens, seq_len, step, batch, rank * rank_rows + k * micro, micro)
            loss = engine(inputs, targets)  # forward
            engine.backward(loss)           # backward
            engine.step()                   # optimizer step on the accumulation boundary
        if metrics:
            report = engine.last_step()
            line = {"step": report["step"], "loss": report["loss"], "lr": report["lr"],
                    "step_ms": (time.perf_counter() - start) * 1000.0}
            metrics.write(json.dumps(line, separators=(",", ":")) + "\n")  # bench/common.sh's `median` reads it
            metrics.flush()
        if args.save_dir and args.save_interval and engine.global_steps % args.save_interval == 0:
            engine.save_checkpoint(args.save_dir)
    if args.save_dir and not (args.save_interval and engine.global_steps % args.save_interval == 0):
        engine.save_checkpoint(args.save_dir)
    if rank == 0 and loss is not None:
        print(f"[train_gpt] {engine.global_steps} steps, rank 0's last loss {loss.item():.6g}", flush=True)


if __name__ == "__main__":
    main()
