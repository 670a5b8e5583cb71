"""ZeRO-3 from Python: between forwards the module's parameters hold no memory at all (measured on their storages,
and read as 0-element tensors),
and each of two ranks keeps half of the model's parameter bytes (plus padding) as its shard; during a step the
submodule units are gathered a few at a time, within stage3_max_live_parameters, never the whole model."""
import json

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("model", ["gpt", "lora"])
def test_zero3_ranks_hold_half_the_parameters_between_forwards(tmp_path, model):
    # "lora": everything frozen but the layer norms, as a LoRA fine-tune's base: the frozen parameters are
    # partitioned too (as DeepSpeed's ZeRO-3 partitions every parameter), not whole on every rank.
    out = tmp_path / "memory.json"
    run_ranks(2, ["zero3_memory.py", str(out), model])
    for rank in range(2):
        report = json.loads(open(f"{out}.{rank}").read())
        assert report["held"] == 0, report  # the module's own tensors, between forwards
        whole, shard = report["whole"], report["engine_params"]
        assert whole / 2 <= shard <= whole / 2 + 64, report  # padded to a multiple of the world size per group
        # fp32: 4 bytes an element; max_live 6000 elements plus the unit demanded beyond it.
        assert report["gathered_peak"] <= 6000 * 4 + report["largest_unit"], report
        assert report["gathered_peak"] < whole / 2, report
        # Released parameters read as empty tensors (no crash, no stale values); head.weight is tied to wte's.
        assert report["read"] == {"state_dict_elements": 0, "norm": 0.0, "head_weight_shape": [0]}, report
        if model == "lora":
            assert report["frozen"] > 0.9 * whole, report
            assert report["frozen"] / 2 <= report["engine_frozen"] <= report["frozen"] / 2 + 64, report
