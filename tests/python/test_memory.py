"""ZeRO-3 from Python: between forwards the module's parameters hold no memory at all (measured on their storages),
and each of two ranks keeps half of the model's parameter bytes (plus padding) as its shard."""
import json

from conftest import run_ranks


def test_zero3_ranks_hold_half_the_parameters_between_forwards(tmp_path):
    out = tmp_path / "memory.json"
    run_ranks(2, ["zero3_memory.py", str(out)])
    for rank in range(2):
        report = json.loads(open(f"{out}.{rank}").read())
        assert report["held"] == 0, report  # the module's own tensors, between forwards
        whole, shard = report["whole"], report["engine_params"]
        assert whole / 2 <= shard <= whole / 2 + 64, report  # padded to a multiple of the world size per group
