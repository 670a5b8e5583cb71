"""dscpp.initialize(mpu=...): a Megatron-style tensor-parallel model (tensor_parallel.py) trains to a plain PyTorch
loop's losses over the whole model, with ZeRO over the mpu's data-parallel groups; and what an mpu must be."""
import json

import pytest
import torch

import dscpp
from conftest import run_ranks


@pytest.mark.parametrize("world,tp,stage", [(2, 2, 0), (4, 2, 0), (4, 2, 1), (4, 2, 2), (4, 2, 3)])
def test_an_mpus_tensor_parallel_model_trains_as_the_whole_one(world, tp, stage, tmp_path):
    out = tmp_path / "losses.json"
    run_ranks(world, ["tensor_parallel.py", str(tp), str(stage), str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], abs=1e-5), result
    # then GatheredParameters(modifier_rank=0) writes each tensor-parallel slice from its own data-parallel group
    assert result["gathered"], result


def test_an_mpu_without_groups_is_named():
    class NotAnMpu:
        pass
    with pytest.raises(TypeError, match="mpu NotAnMpu must have get_data_parallel_group"):
        dscpp.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 1, "optimizer": {
            "type": "SGD", "params": {"lr": 0.1}}}, mpu=NotAnMpu())
