"""Shared fixtures: the test folder on sys.path (models, training) and real multi-process runs over loopback."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, script_args, timeout=300, cwd=HERE, what="a rank failed"):
    """Starts `world` ranks of `python3 SCRIPT ARGS...` (in `cwd`) with torchrun's environment on a fresh loopback
    port; waits for all; fails the test with every rank's output if any rank fails (or the job outlives `timeout`:
    no hang), the message starting with `what`. Returns each rank's output."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable] + script_args, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs, failed = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            failed = True
        outputs.append(out)
        failed = failed or p.returncode != 0
    if failed:
        pytest.fail(f"{what}:\n" + "\n".join(f"--- rank {r} (exit {p.returncode})\n{o}"
                                                  for r, (p, o) in enumerate(zip(procs, outputs))))
    return outputs


def install_deepspeed_name(target):
    """python/deepspeed-compat (the name `deepspeed` for our engine) installed with pip into `target`, a directory to
    put first on PYTHONPATH. Built from a copy, since setuptools writes build/ beside the sources; no build isolation
    (nothing downloaded: the test environment's setuptools builds it), no deps (dscpp is on the path already)."""
    import shutil
    root = os.path.abspath(os.path.join(HERE, "..", ".."))
    source = os.path.join(str(target) + "_src")
    shutil.copytree(os.path.join(root, "python", "deepspeed-compat"), source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--target", str(target), source], check=True, timeout=300,
                   capture_output=True)
    return str(target)
