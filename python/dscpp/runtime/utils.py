"""deepspeed.runtime.utils' names a script calls."""
import gc

import torch
import torch.distributed as dist

from ..accelerator.accelerator import process_memory_bytes


def see_memory_usage(message, force=False):
    """DeepSpeed's memory print, on rank 0 and only with force=True (as DeepSpeed's): `message`, then the GPU's
    allocated / peak / reserved memory when CUDA is in use (and resets its peak), and this process's host memory."""
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()  # freed tensors still referenced by cycles would count otherwise
    print(message)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gib = 2**30
        cuda = torch.cuda
        print(f"MA {cuda.memory_allocated() / gib:.2f} GB  Max_MA {cuda.max_memory_allocated() / gib:.2f} GB"
              f"  CA {cuda.memory_reserved() / gib:.2f} GB  Max_CA {cuda.max_memory_reserved() / gib:.2f} GB")
        torch.cuda.reset_peak_memory_stats()
    rss, peak = process_memory_bytes("VmRSS"), process_memory_bytes("VmHWM")
    if rss:
        print(f"CPU memory of this process: resident {rss / 2**30:.2f} GB, peak {peak / 2**30:.2f} GB")
