"""The CPU and CUDA accelerators (see the package docstring). Answers are DeepSpeed's own for the same device:
tests/conformance/test_accelerator.py holds the CPU one to DeepSpeed's CPU accelerator."""
import contextlib
import os

import torch


def _proc_kib_field(path, field):
    """A "Field:  N kB" line of a /proc file, in bytes; 0 where there is none (no /proc: not Linux)."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _meminfo_bytes(field):
    """The machine's MemTotal or MemAvailable, in bytes."""
    return _proc_kib_field("/proc/meminfo", field)


def process_memory_bytes(field="VmRSS"):
    """This process's VmRSS (resident now) or VmHWM (its peak), in bytes. The CPU accelerator's memory and
    dscpp.runtime.utils.see_memory_usage read it."""
    return _proc_kib_field("/proc/self/status", field)


def _numa_nodes():
    """How many NUMA nodes have CPUs (DeepSpeed's CPU device count without LOCAL_SIZE); 1 where sysfs says nothing."""
    root = "/sys/devices/system/node"
    try:
        nodes = [n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return 1
    with_cpus = 0
    for node in nodes:
        try:
            with open(os.path.join(root, node, "cpulist")) as cpus:
                with_cpus += bool(cpus.read().strip())
        except OSError:
            pass
    return with_cpus or 1


class _Accelerator:
    """What the two share; `_name` is the torch device type."""
    _name = None

    def device_name(self, device_index=None):
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def current_device_name(self):
        return self.device_name(self.current_device())

    def communication_backend_name(self):
        return "nccl" if self._name == "cuda" else "gloo"

    def use_host_timers(self):
        return self.is_synchronized_device()

    def resolves_data_dependency(self):
        return self.is_synchronized_device()

    def handles_memory_backpressure(self):
        return self.is_synchronized_device()

    def is_bf16_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float, torch.bfloat16] + ([torch.float16] if self.is_fp16_supported() else [])

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def random(self):
        return torch.random

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def range_push(self, msg, domain=None, category=None):
        pass

    def range_pop(self, domain=None):
        pass

    def lazy_call(self, callback):
        return callback()

    def total_memory(self, device_index=None):
        return _meminfo_bytes("MemTotal")

    def available_memory(self, device_index=None):
        return _meminfo_bytes("MemAvailable")


class CpuAccelerator(_Accelerator):
    """The CPU: one device per process (DeepSpeed's CPU accelerator counts NUMA nodes, or LOCAL_SIZE, as devices);
    memory figures are this process's resident memory, and the peak is the largest seen since the last reset."""
    _name = "cpu"

    def __init__(self):
        self._peak = process_memory_bytes()

    def is_synchronized_device(self):
        return True

    def is_available(self):
        return True

    def is_fp16_supported(self):
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            return False

    def device_name(self, device_index=None):
        return "cpu"  # torch has one CPU device, whatever the index

    def device(self, device_index=None):
        return None

    def set_device(self, device_index):
        pass

    def current_device(self):
        return int(os.environ.get("LOCAL_RANK", 0))

    def device_count(self):
        local_size = int(os.environ.get("LOCAL_SIZE", 0))
        return local_size if local_size > 0 else _numa_nodes()

    def synchronize(self, device_index=None):
        pass

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        torch.set_rng_state(new_state)

    def default_generator(self, device_index):
        return torch.default_generator

    Stream = None
    Event = None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    def default_stream(self, device_index=None):
        return None

    def empty_cache(self):
        pass

    def memory_allocated(self, device_index=None):
        now = process_memory_bytes()
        self._peak = max(self._peak, now)
        return now

    def max_memory_allocated(self, device_index=None):
        self.memory_allocated()
        return self._peak

    def reset_peak_memory_stats(self, device_index=None):
        self._peak = process_memory_bytes()

    reset_max_memory_allocated = reset_peak_memory_stats
    memory_reserved = memory_cached = memory_allocated
    max_memory_reserved = max_memory_cached = max_memory_allocated

    def memory_stats(self, device_index=None):
        return {"allocated_bytes.all.current": self.memory_allocated(), "allocated_bytes.all.peak": self._peak}

    def pin_memory(self, tensor, align_bytes=1):
        return tensor  # nothing to pin for: the device is the host


class CudaAccelerator(_Accelerator):
    """A CUDA GPU: torch.cuda's answers."""
    _name = "cuda"

    def is_synchronized_device(self):
        return False

    def is_available(self):
        return torch.cuda.is_available()

    def is_fp16_supported(self):
        return True

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def device_count(self):
        return torch.cuda.device_count()

    def synchronize(self, device_index=None):
        torch.cuda.synchronize(device_index)

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)

    def set_rng_state(self, new_state, device_index=None):
        torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    # The GPU's generators only, as DeepSpeed's CUDA accelerator: the CPU's stream of random numbers is left alone.
    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    @property
    def Stream(self):
        return torch.cuda.Stream

    @property
    def Event(self):
        return torch.cuda.Event

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    def empty_cache(self):
        torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        torch.cuda.reset_peak_memory_stats(device_index)

    reset_max_memory_allocated = reset_peak_memory_stats

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def available_memory(self, device_index=None):
        return torch.cuda.mem_get_info(device_index)[0]

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory()

    def range_push(self, msg, domain=None, category=None):
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None):
        torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)


_current = None


def get_accelerator():
    """The accelerator of this process: DS_ACCELERATOR's (cpu or cuda) when set, as DeepSpeed reads it, else CUDA
    when torch sees a GPU, else the CPU. One object per process."""
    global _current
    if _current is None:
        name = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
        kinds = {"cpu": CpuAccelerator, "cuda": CudaAccelerator}
        if name not in kinds:
            raise ValueError(f"DS_ACCELERATOR={name!r}: deepspeed.cpp runs on cpu or cuda")
        _current = kinds[name]()
    return _current


def set_accelerator(accelerator):
    """Makes `accelerator` (a CpuAccelerator or CudaAccelerator) the one get_accelerator returns."""
    global _current
    if not isinstance(accelerator, _Accelerator):
        raise TypeError(f"set_accelerator: expected a dscpp accelerator, got {type(accelerator).__name__}")
    _current = accelerator
