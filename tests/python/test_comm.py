"""dscpp.comm as deepspeed.comm for scripts: is_initialized, the ranks, and the collectives, on 2 real processes.
(tests/conformance/test_api.py holds the signatures against DeepSpeed's.)"""
import json

from conftest import run_ranks


def test_the_facade_over_two_ranks():
    rows = sorted((json.loads(line) for out in run_ranks(2, ["comm_facade.py"]) for line in out.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert (r["world"], r["local_rank"], r["initialized"]) == (2, r["rank"], True)
        assert (r["sum"], r["max"], r["broadcast"], r["gathered"]) == (3.0, 1.0, 10.0, [0.0, 1.0])
    # reduce_scatter of arange(2) + rank summed over the ranks: [1, 3], rank r keeps element r.
    assert [r["scattered"] for r in rows] == [1.0, 3.0]


def test_init_distributed_destroys_its_gloo_group_at_exit_while_the_interpreter_is_whole():
    # Issue 49's abort: a Gloo group freed during interpreter shutdown can abort the process after its last step.
    # atexit runs handlers last-registered first, so this check, registered before init_distributed, runs after
    # dscpp's handler and sees the group gone; and the process exits 0.
    import subprocess
    import sys
    code = ("import atexit, torch.distributed as dist, dscpp\n"
            "atexit.register(lambda: print('at exit initialized:', dist.is_initialized(), flush=True))\n"
            "dscpp.init_distributed(distributed_port=0)  # a free port: the store picks one\n"
            "t = __import__('torch').ones(3); dist.all_reduce(t)\n"
            "print('before exit initialized:', dist.is_initialized(), flush=True)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before exit initialized: True", "at exit initialized: False"]
