"""ZeRO-3 specifics from Python: GatheredParameters reads whole parameters on every rank and writes the modifier
rank's changes into every rank's shards."""
import json

from conftest import run_ranks


def test_gathered_parameters_read_whole_and_write_from_the_modifier_rank(tmp_path):
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_gathered.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        assert seen == {"shape": [128, 32], "equal_to_init": True, "empty_after": True, "modified": True,
                        "trained_from_it": True}, (rank, seen)
