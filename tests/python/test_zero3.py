"""ZeRO-3 specifics from Python: GatheredParameters reads whole parameters on every rank and writes the modifier
rank's changes into every rank's shards; ranks that diverge stop with where each one was."""
import json

from conftest import run_ranks


def test_gathered_parameters_read_whole_and_write_from_the_modifier_rank(tmp_path):
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_gathered.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        assert seen == {"shape": [128, 32], "equal_to_init": True, "empty_after": True, "modified": True,
                        "trained_from_it": True}, (rank, seen)


def test_ranks_that_take_different_branches_stop_with_where_each_was(tmp_path):
    # Step 2: rank 1 skips the branch rank 0 runs. Both raise there (no hang, no crash), naming both ranks' points.
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_diverge.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        assert seen["step"] == 2, (rank, seen)
        assert "ZeRO-3: ranks disagree on the next collective" in seen["message"], (rank, seen)
        # Rank 1 went on to `out` (whose weight the forward reads outside its module) where rank 0 ran `branch`.
        assert "rank 0: demand #3 of micro-step 2 (branch)" in seen["message"], (rank, seen)
        assert "rank 1: demand #3 of micro-step 2 (out)" in seen["message"], (rank, seen)
