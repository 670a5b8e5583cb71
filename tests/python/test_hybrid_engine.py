"""The hybrid engine (issue 54): DeepSpeed-Chat's actor — a LoRA model at ZeRO-3 on 2 processes — generates the
whole model's greedy tokens, gathering each group once per generate() call with pin_parameters (and per forward
without), training resumes on bit-for-bit the same weights, and every rank samples the same tokens
(hybrid_engine.py)."""
import json

import pytest
import torch

import dscpp
from conftest import run_ranks


def run(tmp_path, stage, pin, tp=1):
    out = tmp_path / "result.json"
    run_ranks(2, ["hybrid_engine.py", str(stage), "1" if pin else "0", str(out), str(tp)])
    return json.loads(out.read_text())


@pytest.mark.parametrize("stage,pin", [(3, True), (3, False), (2, True)])
def test_generate_gives_the_whole_models_tokens_and_leaves_the_weights(stage, pin, tmp_path):
    result = run(tmp_path, stage, pin)
    assert result["tokens_equal"], result
    assert result["weights_unchanged"], result  # LoRA fused for the call, restored exactly after
    assert result["sampled_agree"], result  # rank 0's random state on every rank
    assert not result["fused_after"], result
    assert len(result["losses"]) == 3 and all(loss == loss for loss in result["losses"]), result
    if stage == 3 and pin:
        # Each group once for the whole call, by one all-gather: what one forward gathers, fewer than the parameters.
        assert result["gathers"] == result["forward_gathers"] < result["params"], result
    elif stage == 3:
        # Through the hooks: every block again for each of the 8 forwards (the prompt's and 7 new tokens').
        assert result["gathers"] >= 8 * 5, result
    else:
        assert result["gathers"] == 0, result  # ZeRO-2: the weights are whole already


@pytest.mark.parametrize("stage", [3, 2])
def test_inference_tp_size_generates_each_ranks_prompts_over_sliced_layers(stage, tmp_path):
    """hybrid_engine.inference_tp_size 2 on 2 processes: the ranks' different prompts are generated as one batch over
    the layers sliced between them (the fused LoRA q and v projections too), each rank getting the whole model's
    tokens for its own prompts, greedy, and sampled from the group's first rank's random state though the ranks'
    states differ; afterwards the model's own modules and head counts are back, the weights unchanged
    bit for bit, and training goes on."""
    result = run(tmp_path, stage, True, tp=2)
    assert result["layers_seen"] == ["LinearAllreduce", "LinearLayer"], result  # q (its LoRA fused), k; o
    assert result["tokens_equal"], result
    assert result["modules_back"] and result["weights_unchanged"] and not result["fused_after"], result
    assert result["sampled_agree"], result  # the group samples as one, from its first rank's state at the call
    assert len(result["losses"]) == 3 and all(loss == loss for loss in result["losses"]), result


def _engine(**hybrid):
    model = torch.nn.Linear(4, 4)
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "hybrid_engine": {"enabled": True, **hybrid}}
    return dscpp.initialize(model=model, model_parameters=model.parameters(), config=config)[0]


def test_a_model_without_generate_is_named():
    engine = _engine(max_out_tokens=4)
    with pytest.raises(AttributeError, match="Linear has no generate method"):
        engine.generate(input_ids=torch.ones(1, 2, dtype=torch.long))


@pytest.mark.parametrize("hybrid,message", [
    (dict(inference_tp_size=2, pin_parameters=False),
     "hybrid_engine.inference_tp_size = 2: expected 1 when pin_parameters is false"),
    (dict(enable_cuda_graph=True), "hybrid_engine.enable_cuda_graph = true: not supported yet"),
    (dict(max_out_tokens=0), "hybrid_engine.max_out_tokens"),
    (dict(pin_paramters=False), "unknown config key 'hybrid_engine.pin_paramters'.*did you mean 'hybrid_engine.pin_parameters'"),
])
def test_config_errors_name_the_key(hybrid, message):
    with pytest.raises(dscpp.ConfigError, match=message):
        _engine(**hybrid)
