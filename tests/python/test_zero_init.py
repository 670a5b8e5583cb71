"""dscpp.zero.Init: a model built partitioned (no rank holds it whole) is initialised and trains exactly as the same
model built whole; bad arguments are clear errors."""
import json

import pytest
import torch
import torch.nn as nn

import dscpp
from conftest import run_ranks
from models import TinyGpt
from training import ds_config, reference_losses

STEPS = 3


def test_two_ranks_build_partitioned_and_train_as_built_whole(tmp_path):
    out = tmp_path / "seen"
    run_ranks(2, ["zero3_init.py", str(out)])
    expected = reference_losses("gpt", 1, 2, STEPS)
    for rank in range(2):
        seen = json.loads(open(f"{out}.{rank}").read())
        assert seen["param_elements_after_build"] == 0, seen
        assert 0.5 <= seen["shard_fraction"] <= 0.52, seen
        assert seen["equal_before_initialize"] and seen["equal_after_initialize"], seen
        assert seen["gathered_shape"] == [128, 32] and seen["empty_again"] and seen["modified"], seen
        assert seen["losses"] == pytest.approx(expected, abs=1e-5), (seen["losses"], expected)
        assert seen["leaf_losses"] == pytest.approx(expected, abs=1e-5), (seen["leaf_losses"], expected)


def test_one_rank_stray_reads_find_empty_tensors_and_classes_defined_inside_are_partitioned():
    config = ds_config(stage=3, grad_accum=1, world=1)
    with dscpp.zero.Init(config_dict_or_path=config):
        class Defined(nn.Module):  # a class defined inside the context
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
        model = Defined()
        other = TinyGpt()
        assert model.fc.weight.shape == (8, 8)  # read by name inside the context: gathered whole
    # After it, until initialize, parameters are empty tensors (as DeepSpeed's): a stray read or a cast is harmless.
    assert model.fc.weight.numel() == 0 and model.fc.bias.numel() == 0
    assert all(p.numel() == 0 for p in other.parameters())
    other.float()
    print(other.blocks[1].fc.weight)
    engine, *_ = dscpp.initialize(model=other, config=config)
    engine.backward(engine(torch.randint(0, 64, (4, 16))))
    engine.step()
    assert engine.global_steps == 1


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(dscpp.ConfigError, match="stage 3"):
        with dscpp.zero.Init(config_dict_or_path=ds_config(stage=2, grad_accum=1, world=1)):
            pass
    with pytest.raises(NotImplementedError, match="remote_device"):
        dscpp.zero.Init(remote_device="nvme")
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        with dscpp.zero.Init(config_dict_or_path=str(tmp_path / "nowhere.json")):
            pass
    with pytest.raises(ValueError, match="dtype"):
        with dscpp.zero.Init(config_dict_or_path=ds_config(stage=3, grad_accum=1, world=1), dtype=torch.bfloat16):
            pass
    # Built in bf16, trained in fp32; built partitioned, trained under stage 2.
    with dscpp.zero.Init(config_dict_or_path=ds_config(stage=3, grad_accum=1, world=1, dtype="bf16")):
        model = TinyGpt()
    with pytest.raises(dscpp.ConfigError, match="bf16|BFloat16"):
        dscpp.initialize(model=model, config=ds_config(stage=3, grad_accum=1, world=1))
    with dscpp.zero.Init(config_dict_or_path=ds_config(stage=3, grad_accum=1, world=1)):
        model = TinyGpt()
    with pytest.raises(dscpp.ConfigError, match="zero.Init"):
        dscpp.initialize(model=model, config=ds_config(stage=2, grad_accum=1, world=1))
    # The patches are gone after the context, an error inside it included.
    assert not hasattr(nn.Linear.__init__, "_dscpp_original")
    assert nn.Module.apply.__name__ == "apply"
