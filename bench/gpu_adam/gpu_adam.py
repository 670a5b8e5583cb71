#!/usr/bin/env python3
"""bench/gpu_adam: parameters per second of torch's AdamW on one device, the step bench_cpu_adam's CPU Adam is
compared with: fused (one kernel for the whole step, torch's fastest) and foreach, on fp32 tensors of each size, best
of --repeats, the GPU synchronised around each step. Prints one line per size and kind, in bench_cpu_adam's units.
Expected time on a GPU: seconds; with --device cpu (scripts/device-check.sh --dry-run) as fast as the sizes allow.
Usage: gpu_adam.py [--device cuda] [--sizes 16777216 67108864] [--repeats 5]
"""
import argparse
import time

import torch


def best_seconds(repeats, step, sync):
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 24, 1 << 26, 1 << 28])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    device = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"gpu_adam: torch {torch.__version__} AdamW on {name}; best of {a.repeats}; Mparams/s")
    print(f"{'params':>12} {'fused':>10} {'foreach':>10}")
    for n in a.sizes:
        rates = []
        for fused in (True, False):
            param = torch.randn(n, device=device, requires_grad=True)
            param.grad = torch.randn(n, device=device) * 1e-2
            opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.1, fused=fused or None, foreach=not fused)
            opt.step()  # allocates the state: not part of a step
            rates.append(n / best_seconds(a.repeats, opt.step, sync) / 1e6)
            del opt, param
        print(f"{n:>12} {rates[0]:>10.1f} {rates[1]:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
