"""deepspeed.runtime.utils' names a script calls."""
import gc

import torch
import torch.distributed as dist


def _host_gib(field):
    """This process's VmRSS / VmHWM from /proc (Linux), in GiB; None elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


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
    rss, peak = _host_gib("VmRSS"), _host_gib("VmHWM")
    if rss is not None:
        print(f"CPU memory of this process: resident {rss:.2f} GB, peak {peak:.2f} GB")
