#!/usr/bin/python3
"""A plain PyTorch training loop for gpt-train's GPT: the baseline the engine's step time is compared with.

Run with Debian's interpreter, which imports python3-torch (the same LibTorch 1.13 gpt-train links):
    /usr/bin/python3 bench/python_loop/gpt_loop.py --model tiny --steps 20 --metrics loop.jsonl
    build/dscpp launch --num_gpus 2 /usr/bin/python3 bench/python_loop/gpt_loop.py ...   # DDP over Gloo (fp32)
The model is gpt-train's (examples/gpt/model): GPT-2's architecture with its presets, tied head, dropout 0, the
same attention math (LibTorch 1.13 has no fused kernel in C++ or Python), built and initialised in the same order
from the same seed, so the weights, and the loss of the first step, are gpt-train's. The data is gpt-train's
embedded default corpus read from the same files (bytes, sequential windows, the same rows per rank), or --data.
The optimizer is torch.optim.AdamW(foreach=True) on all parameters: lr 1e-3, weight decay 0.1, betas (0.9, 0.999),
eps 1e-8, no clipping, no schedule — what the benches' DeepSpeed config (bench/common.sh zero_config) asks for.
--bf16 trains as the engine's bf16 does: bf16 weights and gradients, AdamW on fp32 master copies.
Writes gpt-train's --metrics lines (step, loss, lr, step_ms, tokens_per_s, world_size, rss_bytes, peak_rss_bytes),
with rank 0's loss (gpt-train's is the mean over ranks, an extra collective a plain loop would not run).
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# (n_layer, n_head, n_embd, block_size), as examples/gpt/model/gpt_config.cpp's kPresets.
PRESETS = {"tiny": (4, 4, 128, 128), "small": (6, 8, 256, 256), "gpt2": (12, 12, 768, 1024),
           "gpt2-medium": (24, 16, 1024, 1024), "gpt2-large": (36, 20, 1280, 1024), "gpt2-xl": (48, 25, 1600, 1024)}
# gpt-train's embedded default corpus (examples/gpt/CMakeLists.txt GPT_CORPUS_DIR / GPT_CORPUS_FILES).
CORPUS_DIR = "/usr/share/common-licenses"
CORPUS_FILES = ["GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "Artistic", "MPL-2.0", "GFDL-1.3"]
INIT_STD = 0.02  # GPT-2's initializer_range


def init_gpt2(module, n_layer):
    """GPT-2's initialisation, as gpt.cpp's init_gpt2: module and everything under it, in registration order."""
    residual_std = INIT_STD / math.sqrt(2.0 * n_layer)
    with torch.no_grad():
        for name, m in module.named_modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, residual_std if name.endswith("c_proj") else INIT_STD)
                m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, INIT_STD)
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()


class Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v stacked along the output dim
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))  # 3 x (B, nh, T, hs)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        y = torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """Modules built and initialised in gpt.cpp's order, so the random draws, and so the weights, are the same."""

    def __init__(self, vocab_size, n_layer, n_head, n_embd, block_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)  # (V, C), also the LM head
        init_gpt2(self.wte, n_layer)
        self.wpe = nn.Embedding(block_size, n_embd)
        init_gpt2(self.wpe, n_layer)
        self.h = nn.ModuleList()
        for _ in range(n_layer):
            self.h.append(Block(n_embd, n_head))
            init_gpt2(self.h[-1], n_layer)
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        init_gpt2(self.ln_f, n_layer)

    def forward(self, idx, targets):  # (B, T) int64 -> mean next-token cross-entropy, in fp32
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def load_tokens(path, seq_len):
    """Byte tokens of --data or of gpt-train's default corpus; random bytes if the corpus files are missing."""
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        files = [os.path.join(CORPUS_DIR, name) for name in CORPUS_FILES]
        if not all(os.path.exists(f) for f in files):
            print(f"[gpt_loop] {CORPUS_DIR} lacks gpt-train's corpus: training on random bytes", flush=True)
            return torch.randint(0, 256, (64 * (seq_len + 1),), generator=torch.Generator().manual_seed(0))
        data = b"".join(open(f, "rb").read() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def rows(tokens, seq_len, step, global_batch, row_begin, num_rows):
    """gpt::BatchSampler::rows in sequential order: sample i reads window i mod W of T + 1 tokens."""
    num_windows = (tokens.numel() - 1) // seq_len
    samples = torch.arange(num_rows) + step * global_batch + row_begin
    starts = (samples % num_windows) * seq_len
    windows = tokens[starts.unsqueeze(1) + torch.arange(seq_len + 1)]  # (rows, T + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def average_fp32(grads):
    """bf16 on several ranks, instead of DDP (Gloo in torch 1.13 reduces no bf16, DDP's first broadcast included):
    average the fp32 master gradients after backward, in one flattened all_reduce."""
    flat = torch._utils._flatten_dense_tensors(grads).div_(torch.distributed.get_world_size())
    torch.distributed.all_reduce(flat)
    for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def memory_bytes():
    """(resident, peak resident) bytes of this process, as gpt-train's rss_bytes / peak_rss_bytes."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    # Under `dscpp launch` / torchrun: DDP over Gloo, each rank training its rows of the global batch.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)

    n_layer, n_head, n_embd, block_size = PRESETS[a.model]
    seq_len = a.seq_len or min(block_size, 128)
    tokens = load_tokens(a.data, seq_len)
    torch.manual_seed(a.seed)
    model = Gpt(256, n_layer, n_head, n_embd, block_size)
    params = list(model.parameters())
    if a.bf16:
        model.to(torch.bfloat16)
        master = [q.detach().float().requires_grad_() for q in params]
    else:
        master = params
    optimizer = torch.optim.AdamW(master, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                                  foreach=True)
    ddp = world > 1 and not a.bf16
    train = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    global_batch = a.micro_batch * world
    if rank == 0:
        print(f"[gpt_loop] torch {torch.__version__}, {torch.get_num_threads()} threads; model {a.model} "
              f"({sum(q.numel() for q in params)} params), seq {seq_len}; global batch {global_batch} = micro "
              f"{a.micro_batch} x world {world}; {'bf16' if a.bf16 else 'fp32'}", flush=True)

    metrics = open(a.metrics, "w") if a.metrics and rank == 0 else None
    for step in range(a.steps):
        start = time.perf_counter()
        inputs, targets = rows(tokens, seq_len, step, global_batch, rank * a.micro_batch, a.micro_batch)
        loss = train(inputs, targets)
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
        step_ms = (time.perf_counter() - start) * 1000.0
        if metrics:
            rss, peak = memory_bytes()
            line = {"step": step + 1, "loss": loss.item(), "lr": a.lr, "step_ms": step_ms,
                    "tokens_per_s": global_batch * seq_len / (step_ms / 1000.0), "world_size": world,
                    "rss_bytes": rss, "peak_rss_bytes": peak}
            metrics.write(json.dumps(line, separators=(",", ":")) + "\n")  # bench/common.sh's `median` reads it
            metrics.flush()
    if rank == 0:
        print(f"[gpt_loop] done: {a.steps} steps, final loss {loss.item():.6g}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
