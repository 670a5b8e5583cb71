#!/usr/bin/env python3
"""A plain PyTorch training loop for gpt-train's GPT: the baseline the engine's step time is compared with.

Run with the interpreter the build is for (scripts/setup.sh's .venv: the torch gpt-train links):
    .venv/bin/python bench/python_loop/gpt_loop.py --model tiny --steps 20 --metrics loop.jsonl
    build/dscpp launch --num_gpus 2 .venv/bin/python bench/python_loop/gpt_loop.py ...   # DDP over Gloo (fp32)
The model and data are gpt-train's, from examples/python/gpt.py: the same weights from the same seed (so the loss of
the first step is gpt-train's), the embedded default corpus read from the same files, or --data.
The optimizer is torch.optim.AdamW(foreach=True) on all parameters: lr 1e-3, weight decay 0.1, betas (0.9, 0.999),
eps 1e-8, no clipping, no schedule — what the benches' DeepSpeed config (bench/common.sh zero_config) asks for.
--fused uses torch's fused AdamW kernel instead; --device cuda trains on one GPU (scripts/device-check.sh).
--bf16 trains as the engine's bf16 does: bf16 weights and gradients, AdamW on fp32 master copies.
Writes gpt-train's --metrics lines (step, loss, lr, step_ms, tokens_per_s, world_size, rss_bytes, peak_rss_bytes,
and vm_peak_bytes, its peak address space) with rank 0's loss (gpt-train's is the mean over ranks, an extra
collective a plain loop would not run).
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))

from gpt import PRESETS, Gpt, load_tokens, rows  # noqa: E402  (examples/python, put on sys.path above)


def average_fp32(grads):
    """bf16 on several ranks, instead of DDP (written when torch 1.13's Gloo reduced no bf16; kept so figures compare):
    average the fp32 master gradients after backward, in one flattened all_reduce."""
    flat = torch._utils._flatten_dense_tensors(grads).div_(torch.distributed.get_world_size())
    torch.distributed.all_reduce(flat)
    for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def memory_bytes():
    """(resident, peak resident, peak address space) bytes of this process; the first two as gpt-train's rss_bytes /
    peak_rss_bytes. The address space (VmPeak) counts what was mapped and never touched too: what prlimit --as limits."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/status") as f:
        vm_peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmPeak:"))
    return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, vm_peak


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--micro_batch", type=int, default=8, help="rows per process and step")
    p.add_argument("--seq_len", type=int, help="tokens per row (default: the block size, at most 128)")
    p.add_argument("--bf16", action="store_true", help="bf16 weights and gradients, fp32 master weights")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: OMP_NUM_THREADS or torch's)")
    p.add_argument("--metrics", help="write one JSON line per optimizer step here (gpt-train's fields)")
    p.add_argument("--data", help="a text file, read as bytes (default: gpt-train's embedded corpus's files)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradient norm to this (0: no clipping)")
    p.add_argument("--no_progress", action="store_true", help="accepted for gpt-train's command lines")
    p.add_argument("--n_layer", type=int, help="override the preset's depth (as gpt-train's flag)")
    p.add_argument("--n_embd", type=int, help="override the preset's width")
    p.add_argument("--n_head", type=int, help="override the preset's head count")
    p.add_argument("--no_foreach", action="store_true",
                   help="AdamW one tensor at a time: no whole-model temporaries (the leanest plain loop in memory)")
    p.add_argument("--fused", action="store_true",
                   help="torch's fused AdamW kernel (fused=True): the fastest plain step on a GPU")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: this rank's GPU (cuda:LOCAL_RANK); step times then wait for the GPU to finish")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    # Under `dscpp launch` / torchrun: DDP over Gloo, each rank training its rows of the global batch.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("cpu")
    if a.device == "cuda":
        if world > 1:
            p.error("--device cuda trains on one process (the ranks would average over Gloo); run it without launch")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)

    n_layer, n_head, n_embd, block_size = PRESETS[a.model]
    n_layer, n_head, n_embd = a.n_layer or n_layer, a.n_head or n_head, a.n_embd or n_embd
    seq_len = a.seq_len or min(block_size, 128)
    tokens = load_tokens(a.data, seq_len)
    torch.manual_seed(a.seed)
    model = Gpt(256, n_layer, n_head, n_embd, block_size).to(device)
    params = list(model.parameters())
    if a.bf16:
        model.to(torch.bfloat16)
        master = [q.detach().float().requires_grad_() for q in params]
    else:
        master = params
    # fused and foreach exclude each other in torch.optim.AdamW.
    optimizer = torch.optim.AdamW(master, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                                  foreach=False if a.fused else not a.no_foreach, fused=a.fused or None)
    ddp = world > 1 and not a.bf16
    train = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    global_batch = a.micro_batch * world
    if rank == 0:
        print(f"[gpt_loop] torch {torch.__version__}, {torch.get_num_threads()} threads; model {a.model} "
              f"({sum(q.numel() for q in params)} params), seq {seq_len}; global batch {global_batch} = micro "
              f"{a.micro_batch} x world {world}; {'bf16' if a.bf16 else 'fp32'}; {device}"
              f"{'; fused AdamW' if a.fused else ''}", flush=True)

    metrics = open(a.metrics, "w") if a.metrics and rank == 0 else None
    for step in range(a.steps):
        start = time.perf_counter()
        inputs, targets = rows(tokens, seq_len, step, global_batch, rank * a.micro_batch, a.micro_batch)
        loss = train(inputs.to(device), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        if a.bf16:
            model.zero_grad(set_to_none=True)
        loss.backward()
        if a.bf16:
            for m, q in zip(master, params):
                m.grad = q.grad.float()
            if world > 1:
                average_fp32([m.grad for m in master])
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(master, a.clip)
        optimizer.step()
        if a.bf16:
            with torch.no_grad():
                for m, q in zip(master, params):
                    q.copy_(m)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step is done when the GPU is, as gpt-train's (it reads the loss)
        step_ms = (time.perf_counter() - start) * 1000.0
        if metrics:
            rss, peak, vm_peak = memory_bytes()
            line = {"step": step + 1, "loss": loss.item(), "lr": a.lr, "step_ms": step_ms,
                    "tokens_per_s": global_batch * seq_len / (step_ms / 1000.0), "world_size": world,
                    "rss_bytes": rss, "peak_rss_bytes": peak, "vm_peak_bytes": vm_peak}
            metrics.write(json.dumps(line, separators=(",", ":")) + "\n")  # bench/common.sh's `median` reads it
            metrics.flush()
    if rank == 0:
        print(f"[gpt_loop] done: {a.steps} steps, final loss {loss.item():.6g}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
