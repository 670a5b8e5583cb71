"""ZeRO-3 specifics from Python: GatheredParameters reads whole parameters on every rank and writes the modifier
rank's changes into every rank's shards; ranks that diverge stop with where each one was."""
import json

from conftest import run_ranks


def test_gathered_parameters_read_whole_and_write_from_the_modifier_rank_and_the_hooks_come_off(tmp_path):
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_gathered.py", str(out)])
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        # then TRL's unwrap_model_for_generation (the hooks off over the gathered model, then back): the same
        # output as the hooked model's, the hooks counted back (a pre-hook and a hook for each of the
        # model's 17 units, the bare forward's two), and a step after it
        assert seen == {"shape": [128, 32], "equal_to_init": True, "empty_after": True, "modified": True,
                        "trained_from_it": True, "hooks": 36, "hooks_back": 36, "external": [],
                        "plain_equals_hooked": True, "released": True, "steps": 2}, (rank, seen)


def test_gathered_parameters_of_two_engines_write_only_what_the_modifier_rank_changed(tmp_path):
    # TRL's SyncRefModelCallback under ZeRO-3 (bf16): a policy's and its reference's parameters gathered together;
    # rank 0 mixes the policy into the reference, which every rank then holds; the policy, unchanged, keeps its fp32
    # master bit for bit (a write of its bf16 values would round it): its next step equals its twin's.
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_sync_ref.py", str(out)])
    seen = [json.loads(open(f"{out}.{rank}").read()) for rank in range(2)]
    assert seen[0]["reference_after"] == seen[1]["reference_after"] == seen[0]["mixed"], seen
    assert seen[0]["policy_equals_twin"] and seen[1]["policy_equals_twin"], seen


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
