"""python/deepspeed-compat: the name `deepspeed` for our engine. Installed (pip, into a directory of its own, first
on the path) it must answer every `import deepspeed...` a script makes with dscpp's own modules, carry the DeepSpeed
version we conform to, and train a DeepSpeed script unchanged exactly as `import dscpp as deepspeed` does."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import install_deepspeed_name, run_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def name_dir(tmp_path_factory):
    return install_deepspeed_name(tmp_path_factory.mktemp("deepspeed_name"))


def python_with_name(name_dir, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([name_dir, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_deepspeed_module_is_dscpps_own(name_dir):
    out = python_with_name(name_dir, """
import importlib.metadata, json, deepspeed, dscpp
import deepspeed.comm as dist
import deepspeed.zero, deepspeed.moe.layer, deepspeed.ops.adam, deepspeed.runtime.lr_schedules, deepspeed.checkpointing
from deepspeed.runtime.lr_schedules import WarmupLR
from deepspeed.utils import RepeatingLoader
from deepspeed.accelerator import get_accelerator
from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME
from deepspeed.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus
pairs = [(deepspeed.initialize, dscpp.initialize), (deepspeed.init_distributed, dscpp.init_distributed),
         (dist, dscpp.comm), (deepspeed.zero.Init, dscpp.zero.Init), (deepspeed.moe.layer.MoE, dscpp.moe.layer.MoE),
         (deepspeed.ops.adam.DeepSpeedCPUAdam, dscpp.ops.adam.DeepSpeedCPUAdam),
         (WarmupLR, dscpp.runtime.lr_schedules.WarmupLR),
         (RepeatingLoader, dscpp.utils.RepeatingLoader), (deepspeed.checkpointing, dscpp.checkpointing),
         (get_accelerator, dscpp.accelerator.get_accelerator),
         (GatheredParameters, dscpp.zero.GatheredParameters), (ZeroParamStatus, dscpp.zero.parameter.ZeroParamStatus)]
try:
    import deepspeed.pipe
    missing = None
except ModuleNotFoundError as e:
    missing = str(e)
print(json.dumps({"same": [a is b for a, b in pairs], "file": deepspeed.__file__, "version": deepspeed.__version__,
                  "metadata": importlib.metadata.version("deepspeed"),
                  "parts": [deepspeed.__version_major__, deepspeed.__version_minor__, deepspeed.__version_patch__],
                  "dscpp_spec": dscpp.comm.__spec__.name, "missing": missing, "env_file": DEEPSPEED_ENVIRONMENT_NAME}))
""")
    seen = json.loads(out.splitlines()[-1])
    assert all(seen["same"]), seen["same"]
    assert seen["file"].startswith(name_dir)
    assert seen["dscpp_spec"] == "dscpp.comm"  # dscpp stays itself under its own name
    assert seen["missing"] == "No module named 'deepspeed.pipe': deepspeed.cpp (dscpp) has no 'dscpp.pipe'"
    assert seen["env_file"] == ".deepspeed_env"  # the file our launcher exports to every node, as DeepSpeed's
    # DeepSpeed's command, as Accelerate's multi-node launch runs it: `dscpp launch` (dscpp.launcher.runner:main).
    with open(os.path.join(name_dir, "bin", "deepspeed")) as f:
        assert "from dscpp.launcher.runner import main" in f.read()
    # The version Accelerate and Transformers read: the DeepSpeed release tests/conformance holds us to.
    pin = re.search(r"^DEEPSPEED_PIN=(\S+)$", open(os.path.join(ROOT, "scripts", "setup.sh")).read(), re.M).group(1)
    assert seen["version"] == seen["metadata"] == pin
    assert seen["parts"] == [int(x) for x in pin.split(".")]


def test_a_deepspeed_script_trains_unchanged_as_under_dscpp(name_dir, tmp_path, monkeypatch):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                                  "steps_per_print": 1000, "zero_optimization": {"stage": 2},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                                  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}}))
    conformance = os.path.join(ROOT, "tests", "conformance")
    script = ["train_script.py", "--config", str(config), "--steps", "4"]

    def records(impl, path_first=None):
        with monkeypatch.context() as m:
            if path_first:
                m.setenv("PYTHONPATH", os.pathsep.join([path_first, os.environ.get("PYTHONPATH", "")]))
            out = run_ranks(2, [script[0], "--impl", impl] + script[1:], cwd=conformance, what=impl)
        return [json.loads(line) for line in out[0].splitlines() if line.startswith('{"step"')]

    under_the_name = records("deepspeed", name_dir)  # `import deepspeed`, which is ours here
    as_dscpp = records("dscpp")                        # `import dscpp as deepspeed`
    assert len(under_the_name) == 4
    assert under_the_name == as_dscpp  # the same engine: every loss, lr and norm bit for bit
