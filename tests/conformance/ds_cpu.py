"""What real DeepSpeed needs to run our conformance scripts on a CPU-only machine, in one place.

DeepSpeed picks its CPU accelerator when it finds no GPU, but it probes for CUDA first through the torch build (ours
is the CUDA wheel); DS_ACCELERATOR=cpu names the CPU one outright. Without Intel's oneCCL bindings that accelerator
talks over Gloo, which is what our engine uses on CPU as well. Imported before `import deepspeed`.
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
