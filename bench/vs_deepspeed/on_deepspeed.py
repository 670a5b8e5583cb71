"""Runs a script written for `import dscpp as deepspeed` on real DeepSpeed instead: bench/vs_deepspeed's way of timing
the same script on both. Usage: python on_deepspeed.py SCRIPT ARGS... (or under `dscpp launch`)

The only differences it makes, all here:
- DS_ACCELERATOR=cpu (DeepSpeed probes CUDA through the torch build first; on a CPU machine it must be told), and
  the name `dscpp` answers with the real `deepspeed` package;
- DeepSpeed's engine gets `last_step()`, deepspeed.cpp's per-step report, which examples/python/train_gpt.py reads for
  its --metrics line: the step count and lr (DeepSpeed keeps no loss of its own to report; the bench reads step_ms);
- the process leaves with os._exit(0) once the script returns (see the end of this file).
"""
import os
import runpy
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402  (after DS_ACCELERATOR)
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402


def _last_step(engine):
    return {"step": engine.global_steps, "loss": None, "lr": engine.get_lr()[0]}


DeepSpeedEngine.last_step = _last_step
sys.modules["dscpp"] = deepspeed
# A launcher (dscpp launch, as DeepSpeed's) puts --local_rank=N before the script: it goes to the script, after it.
launcher_args = [a for a in sys.argv[1:] if a.startswith("--local_rank")]
rest = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
script = rest[0]
sys.argv = [script] + launcher_args + rest[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
# DeepSpeed leaves its Gloo process group for interpreter shutdown to free, which sometimes aborts the process after
# its last step ("terminate called without an active exception"; seen here in a two-process ZeRO-3 run, and in
# tests/conformance/exit_under_load.sh): the script is done and its metrics written, so leave without that teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
