"""DeepSpeed's ops: the CPU optimizers as torch.optim optimizers (dscpp.ops.adam.DeepSpeedCPUAdam, the engine's SIMD
kernel; adagrad.DeepSpeedCPUAdagrad; lion.DeepSpeedCPULion) and LAMB (lamb.FusedLamb)."""
from . import adam  # noqa: F401
