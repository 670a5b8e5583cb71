"""DeepSpeed's ops: the kernels the engine uses, as torch.optim optimizers (dscpp.ops.adam.DeepSpeedCPUAdam)."""
from . import adam  # noqa: F401
