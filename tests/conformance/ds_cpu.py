"""What real DeepSpeed needs to run our conformance scripts on a CPU-only machine, in one place.

DeepSpeed picks its CPU accelerator when it finds no GPU, but it probes for CUDA first through the torch build (ours
is the CUDA wheel); DS_ACCELERATOR=cpu names the CPU one outright. Without Intel's oneCCL bindings that accelerator
talks over Gloo, which is what our engine uses on CPU as well. Imported before `import deepspeed`.
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def without_shared_memory_all_reduce():
    """DeepSpeed's inference layers (AutoTP's LinearAllreduce) all-reduce through its shared-memory kernel
    (deepspeed_shm_comm) when it builds, and that kernel crashes the process (SIGSEGV) on our machines; without it
    DeepSpeed takes the process group's all_reduce, as it does on a CPU without the kernel's ISA. Call after
    `import deepspeed`, before init_distributed."""
    import importlib
    # By its module path: the attribute deepspeed.comm.torch is the torch package, which that module imports.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
