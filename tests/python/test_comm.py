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
