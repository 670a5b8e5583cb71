"""dscpp.accelerator: DeepSpeed's device abstraction (deepspeed.accelerator) — get_accelerator() and what scripts and
libraries ask of it: the device's name and count, the communication backend, supported dtypes, seeds, memory. Ours
speaks for the two devices the engine runs on, the CPU and CUDA, by asking torch; DeepSpeed's other accelerators
(XPU, NPU, HPU, MPS, ...) have no counterpart."""
from .accelerator import CpuAccelerator, CudaAccelerator, get_accelerator, set_accelerator  # noqa: F401
