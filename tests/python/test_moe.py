"""dscpp.moe: DeepSpeed's MoE layer from Python — its names and marks, its forward and gradients against DeepSpeed's
dense formulas (moe_reference.py), its errors, DeepSpeed's optimizer-group helpers, and a DeepSpeed-MoE script run
with `import dscpp as deepspeed` on real processes (ep 2, ep 2 × data 2; ep 1 under ZeRO-3) against a plain loop on
one process, across a checkpoint from ep 2 to ep 1, and the Python GPT with MoE against gpt-train."""
import json
import math

import pytest
import torch
import torch.nn as nn

import dscpp
from dscpp.moe.layer import MoE
from dscpp.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

import moe_reference
from conftest import run_ranks

DIM, HIDDEN = 8, 12


def expert():
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))


def test_names_marks_and_copies_are_deepspeeds():
    torch.manual_seed(0)
    layer = MoE(hidden_size=DIM, expert=expert(), num_experts=3, k=2, use_residual=True)
    names = [name for name, _ in layer.named_parameters()]
    assert names == (["deepspeed_moe.gate.wg.weight"] +
                     [f"deepspeed_moe.experts.deepspeed_experts.{i}.{p}" for i in range(3)
                      for p in ("0.weight", "0.bias", "2.weight", "2.bias")] +
                     ["mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "coefficient.weight",
                      "coefficient.bias"])
    experts = layer.deepspeed_moe.experts.deepspeed_experts
    assert all(is_moe_param(p) and p.group_name == "ep_size_1" for p in experts.parameters())
    assert not any(is_moe_param(p) for p in layer.mlp.parameters())
    assert not is_moe_param(layer.deepspeed_moe.gate.wg.weight)
    assert layer.deepspeed_moe.gate.wg.weight.dtype == torch.float32
    # deep copies: equal values, tensors of their own
    assert torch.equal(experts[0][0].weight, experts[2][0].weight)
    assert experts[0][0].weight.data_ptr() != experts[2][0].weight.data_ptr()
    assert layer.expert_parameter_names()["deepspeed_moe.experts.deepspeed_experts.1.0.bias"] == \
        "deepspeed_moe.experts.deepspeed_experts.1.0.bias"


@pytest.mark.parametrize("k,drop,residual", [(1, True, False), (1, False, True), (2, True, True), (2, False, False)])
def test_forward_and_gradients_equal_deepspeeds_dense_formulas(k, drop, residual):
    torch.manual_seed(0)
    layer = MoE(hidden_size=DIM, expert=expert(), num_experts=4, k=k, min_capacity=1, use_residual=residual,
                drop_tokens=drop, use_rts=False, top2_2nd_expert_sampling=False)
    experts = list(layer.deepspeed_moe.experts.deepspeed_experts)
    for i, e in enumerate(experts):
        torch.manual_seed(10 + i)
        for p in e.parameters():
            p.data.uniform_(-0.5, 0.5)
    with torch.no_grad():
        layer.deepspeed_moe.gate.wg.weight[0] += 0.5  # expert 0 is most tokens' favourite: they overflow it
    x = torch.randn(3, 7, DIM) + 0.5  # inputs leaning one way, so the raised row wins
    probe = torch.randn(3, 7, DIM)

    def run(forward):
        layer.zero_grad()
        out, l_aux, counts = forward()
        ((out * probe).sum() + 3.0 * l_aux).backward()
        return out.detach(), l_aux.detach(), counts, {n: p.grad.clone() for n, p in layer.named_parameters()}

    ours = run(lambda: layer(x))
    wg = layer.deepspeed_moe.gate.wg.weight
    reference = run(lambda: moe_reference.moe_forward(x, wg, experts, k, 1.0, 1, drop,
                                                      (layer.mlp, layer.coefficient) if residual else None))
    assert torch.allclose(ours[0], reference[0], atol=1e-6)
    assert ours[1].item() == pytest.approx(reference[1].item(), abs=1e-7)
    assert ours[2].tolist() == reference[2].tolist()
    if drop:
        assert ours[2][0] > math.ceil(21 / 4 * k)  # over expert 0's capacity: the test drops tokens indeed
    for name, grad in reference[3].items():
        assert torch.allclose(ours[3][name], grad, atol=1e-5), name


def test_bad_options_are_named_with_their_values():
    cases = [(dict(num_experts=6, ep_size=4), "MoE num_experts 6 is not divisible by ep_size 4"),
             (dict(num_experts=4, k=3), "MoE k is 3; it must be 1 or 2"),
             (dict(num_experts=4, capacity_factor=0.0), "MoE capacity_factor is 0; it must be > 0"),
             (dict(num_experts=4, eval_capacity_factor=-0.5), "MoE eval_capacity_factor is -0.5; it must be > 0"),
             (dict(num_experts=4, noisy_gate_policy="Gaussian"),
              'noisy_gate_policy "Gaussian" is not one of None, Jitter, RSample')]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            MoE(hidden_size=DIM, expert=expert(), **kwargs)
    with pytest.raises(ValueError, match="MoE hidden_size is 0; it must be an int >= 1"):
        MoE(hidden_size=0, expert=expert(), num_experts=2)
    with pytest.raises(ValueError, match=r"MoE dispatch: tokens must be \(S, M\) and the gate weight"):
        MoE(hidden_size=DIM, expert=expert(), num_experts=2)(torch.randn(4, DIM + 1))
    with pytest.raises(NotImplementedError, match="use_tutel"):
        MoE(hidden_size=DIM, expert=expert(), num_experts=2, use_tutel=True)
    with pytest.raises(TypeError, match="expert must be a torch.nn.Module"):
        MoE(hidden_size=DIM, expert=lambda x: x, num_experts=2)
    layer = MoE(hidden_size=DIM, expert=expert(), num_experts=4, ep_size=2)
    with pytest.raises(RuntimeError, match="ep_size 2 ranks and has no expert-parallel group yet"):
        layer(torch.randn(2, 8, DIM))
    with pytest.raises(NotImplementedError, match="used_token"):
        MoE(hidden_size=DIM, expert=expert(), num_experts=2)(torch.randn(8, DIM), used_token=torch.ones(8))
    with pytest.raises(ValueError, match="MoE ep_size 2 must divide the data-parallel size 1"):
        dscpp.initialize(model=nn.Sequential(layer), config={"train_batch_size": 1, "optimizer": {
            "type": "SGD", "params": {"lr": 0.1}}})


class WithMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.moe = MoE(hidden_size=DIM, expert=expert(), num_experts=2)

    def forward(self, x):
        out, l_aux, _ = self.moe(self.inp(x))
        return out.square().mean() + l_aux


def test_moe_optimizer_groups_are_deepspeeds():
    torch.manual_seed(0)
    model = WithMoE()
    experts = list(model.moe.deepspeed_moe.experts.parameters())
    shared = [p for p in model.parameters() if not is_moe_param(p)]
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "decay", "weight_decay": 0.1})
    assert isinstance(groups, tuple) and len(groups) == 2
    assert groups[0]["name"] == "decay" and "moe" not in groups[0] and groups[0]["weight_decay"] == 0.1
    assert [id(p) for p in groups[0]["params"]] == [id(p) for p in shared]
    assert groups[1]["name"] == "ep_size_1" and groups[1]["moe"] is True and groups[1]["weight_decay"] == 0.1
    assert [id(p) for p in groups[1]["params"]] == [id(p) for p in experts]
    # max_group_size splits an expert group by elements
    split = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(model.parameters()), "name": "all"}], max_group_size=DIM * HIDDEN + HIDDEN)
    assert [len(g["params"]) for g in split[1:]] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="must be a dict with 'params' and 'name'"):
        split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters())})
    # the engine takes them as it takes any parameter groups, and trains
    engine, _, _, _ = dscpp.initialize(model=model, model_parameters=groups, config={
        "train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.1}}})
    assert engine.has_moe_layers and engine.num_experts == [2] and engine.moe_layers == [model.moe]
    before = experts[0].detach().clone()
    engine.backward(engine(torch.randn(4, 6, DIM)))
    engine.step()
    assert not torch.equal(before, experts[0])


# ep 1 under ZeRO-3: the experts are data-parallel parameters like any other, gathered by the module hooks (the gate's
# weight is read outside its module's forward: fetched on access).
@pytest.mark.parametrize("world,ep,stage,k,residual,drop", [
    (2, 2, 1, 1, 0, 1), (2, 2, 2, 2, 1, 1), (4, 2, 2, 2, 0, 0), (2, 1, 3, 2, 1, 1)])
def test_a_deepspeed_moe_script_trains_as_one_process(world, ep, stage, k, residual, drop, tmp_path):
    out = tmp_path / "losses.json"
    run_ranks(world, ["moe_train.py", str(ep), str(stage), str(k), str(residual), str(drop), "8", str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], abs=1e-5), result


def test_megatron_deepspeeds_mpu_at_tensor_parallel_size_1_trains_as_one_process(tmp_path):
    out = tmp_path / "losses.json"
    run_ranks(2, ["moe_train.py", "--mpu", "1", "2", "2", "2", "0", "1", "6", str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], abs=1e-5), result


def test_ep2_under_tensor_parallelism_stops_naming_both_sizes(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ranks(4, ["moe_train.py", "--mpu", "2", "2", "2", "1", "0", "1", "2", str(tmp_path / "losses.json")])
    message = "MoE layers with ep_size 2 under tensor parallelism (the mpu's tensor-parallel size is 2)"
    assert str(failed.value).count(message) == 4, str(failed.value)  # every rank says why


def test_built_inside_zero_init_the_experts_are_whole_copies_and_train_as_the_loop(tmp_path):
    """Experts deep-copies its expert, which zero.Init has already cut down: the copies are made from the gathered
    values (not from empty tensors), and the engine partitions them at initialize."""
    out = tmp_path / "losses.json"
    run_ranks(2, ["moe_train.py", "--zero_init", "1", "3", "2", "1", "1", "6", str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], abs=1e-5), result


def test_under_activation_checkpointing_the_recompute_routes_the_same(tmp_path):
    """The MoE layer inside dscpp.checkpointing.checkpoint at ep 2: its all-to-alls run again in backward (the Python
    function called from the C++ backward), and l_aux leaves the checkpoint with its gradient."""
    out = tmp_path / "losses.json"
    run_ranks(2, ["moe_train.py", "--checkpointing", "2", "2", "2", "1", "1", "6", str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], abs=1e-5), result
    assert result["moe_forwards"] == 2 * 6  # each micro-step's forward and its recompute


def test_zero3_with_ep2_stops_naming_the_rule(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ranks(2, ["moe_train.py", "2", "3", "1", "0", "1", "2", str(tmp_path / "losses.json")])
    message = "ZeRO stage 3 with expert parallelism (ep_size 2) is not supported"
    assert str(failed.value).count(message) >= 2, str(failed.value)  # both ranks say why


def test_bf16_at_ep2_stays_near_the_fp32_loop(tmp_path):
    """bf16 compute (the tokens cross the all-to-all in bf16: Gloo's as fp16 bits) against the fp32 plain loop: within
    bf16's rounding (measured 1.4e-2 over 6 steps on losses near 3.5). The fp32 runs above hold the routing exact;
    this one holds the bf16 path (casts, the bf16 exchange, the fp32 gate) working end to end."""
    out = tmp_path / "losses.json"
    run_ranks(2, ["moe_train.py", "--bf16", "2", "2", "2", "1", "1", "6", str(out)])
    result = json.loads(out.read_text())
    assert result["engine"] == pytest.approx(result["reference"], rel=2e-2), result
    assert result["engine"] != pytest.approx(result["reference"], abs=1e-5), "bf16 must have been on"


def test_a_checkpoint_saved_at_ep2_continues_at_ep1(tmp_path):
    saved, resumed = tmp_path / "saved.json", tmp_path / "resumed.json"
    run_ranks(2, ["moe_train.py", "2", "2", "2", "0", "1", "6", str(saved), str(tmp_path / "ckpt")])
    run_ranks(1, ["moe_train.py", "1", "2", "2", "0", "1", "6", str(resumed), "-", str(tmp_path / "ckpt"), "2"])
    first, second = json.loads(saved.read_text()), json.loads(resumed.read_text())
    assert first["engine"] == pytest.approx(first["reference"], abs=1e-5), first
    assert second["engine"] == pytest.approx(first["engine"][3:], abs=1e-5), (first, second)


def test_the_python_gpt_with_moe_gives_gpt_trains_losses_and_checkpoints(tmp_path):
    """examples/python/train_gpt.py's MoE GPT (dscpp.moe.layer.MoE in blocks 1 and 3) at ep 2 on two ranks against
    gpt-train's C++ one on one process (ep 1, the same micro-batches by accumulation); gpt-train then resumes the
    Python run's ep-2 checkpoint at ep 1."""
    from test_checkpoint import losses, run_example, run_gpt_train
    config = tmp_path / "moe.json"
    config.write_text(json.dumps({
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}}))
    moe = ["--moe_experts", "4", "--moe_top_k", "2", "--moe_use_residual", "true", "--moe_use_rts", "false",
           "--moe_top2_2nd_expert_sampling", "false"]
    run_gpt_train(str(config), 4, tmp_path / "cpp.jsonl", *moe)
    run_example(2, str(config), 4, tmp_path / "py.jsonl", *moe, "--ep_size", "2", "--save_dir",
                str(tmp_path / "ckpt"), "--save_interval", "2")
    python = losses(tmp_path / "py.jsonl")
    assert python == pytest.approx(losses(tmp_path / "cpp.jsonl"), abs=1e-5)
    (tmp_path / "ckpt" / "latest").write_text("global_step2")  # the step-2 checkpoint, not the final one
    run_gpt_train(str(config), 4, tmp_path / "resumed.jsonl", *moe, "--load_dir", str(tmp_path / "ckpt"))
    assert losses(tmp_path / "resumed.jsonl") == pytest.approx(python[2:], abs=1e-5)
