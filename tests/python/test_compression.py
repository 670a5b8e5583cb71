"""DeepSpeed Compression (issue 56): the quantizers against DeepSpeed's formulas written out here, the pruning masks,
packing, init_compression / redundancy_clean on a small transformer and a conv net (the cleaned model computes what
the compressed one did, with fewer and smaller tensors), the schedule stepping with the engine, MoQ's bit drops,
layer reduction, the config's errors, and training on 2 processes at ZeRO-2 equal to 1 process
(compression_train.py)."""
import json
import math
import os
import subprocess

import pytest
import torch

import dscpp
from compression_models import (DIM, HEADS, HIDDEN, ConvNet, TinyLM, batch, ds_config, every_technique, group,
                                technique)
from conftest import run_ranks
from dscpp._C import compression as q
from dscpp.compression import init_compression, redundancy_clean
from dscpp.compression.basic_layer import Conv2dLayer_Compress, LinearLayer_Compress

# ---- DeepSpeed's arithmetic, written out (deepspeed/compression/utils.py, runtime/quantize.py) ----------------------


def ref_symmetric(x, bits, groups):
    levels = 2 ** bits
    g = x.reshape(groups, -1)
    scale = 2 * torch.amax(torch.abs(g), dim=-1).view(groups, -1) / levels
    return ((g / scale).round().clamp(-levels // 2, levels // 2 - 1) * scale).reshape(x.shape)


def ref_asymmetric(x, bits, groups):
    levels = 2 ** bits
    g = x.reshape(groups, -1)
    lo, hi = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
    scale = (hi - lo) / levels
    zero = (lo / scale).round() * scale
    return (((g - zero) / scale).round().clamp(0, levels - 1) * scale + zero).reshape(x.shape)


def ref_ternary(x, groups):
    g = x.reshape(groups, -1)
    thres = (0.7 * g.norm(p=1, dim=1).div(g.shape[1])).view(-1, 1)
    pos, neg = (g > thres).float(), (g < -thres).float()
    mask = (g.abs() > thres).float()
    alpha = ((mask * g).abs().sum(dim=1) / mask.sum(dim=1)).view(-1, 1)
    return (alpha * pos - alpha * neg).reshape(x.shape)


def ref_binary(x, groups):
    g = x.reshape(groups, -1)
    return g.sign().mul(g.norm(p=1, dim=1, keepdim=True).div(g.shape[1])).reshape(x.shape)


def weights(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize("groups", [1, 4])
def test_symmetric_and_asymmetric_equal_deepspeeds_formulas(bits, groups):
    x = weights(8, 12)
    assert torch.equal(q.quantize(x, q.SYMMETRIC, bits, groups), ref_symmetric(x, bits, groups))
    assert torch.equal(q.quantize(x, q.ASYMMETRIC, bits, groups), ref_asymmetric(x, bits, groups))
    values = q.quantize(x, q.SYMMETRIC, bits, groups).reshape(groups, -1)
    assert all(len(row.unique()) <= 2 ** bits for row in values)  # on the grid: at most 2^bits levels per group


@pytest.mark.parametrize("groups", [1, 4])
def test_ternary_and_binary_equal_deepspeeds_formulas(groups):
    x = weights(8, 12, seed=1)
    assert q.weight_quantizer(2, True) == q.TERNARY and q.weight_quantizer(1, True) == q.BINARY
    assert torch.equal(q.quantize(x, q.TERNARY, 2, groups), ref_ternary(x, groups))
    assert torch.equal(q.quantize(x, q.BINARY, 1, groups), ref_binary(x, groups))
    assert len(q.quantize(x, q.TERNARY, 2, 1).unique()) == 3


def test_static_range_uses_the_running_range():
    x = weights(4, 6, seed=2)
    lo, hi = torch.tensor(-1.5), torch.tensor(2.0)
    levels = 2 ** 8
    scale = 2 * torch.max(lo.abs(), hi).view(-1) / levels
    expected = (x / scale).round().clamp(-levels // 2, levels // 2 - 1) * scale
    assert torch.equal(q.quantize(x, q.SYMMETRIC, 8, 1, torch.stack([lo, hi])), expected)
    scale = (hi - lo) / levels
    zero = (lo / scale).round() * scale
    expected = ((x - zero) / scale).round().clamp(0, levels - 1) * scale + zero
    assert torch.equal(q.quantize(x, q.ASYMMETRIC, 8, 1, torch.stack([lo, hi])), expected)


def test_moq_rounds_to_nearest_or_stochastically_with_torchs_generator():
    x = weights(6, 8, seed=3)
    assert torch.equal(q.moq_quantize(x, 4, 2, True, False), ref_symmetric(x, 4, 2))
    assert torch.equal(q.moq_quantize(x, 4, 2, False, False), ref_asymmetric(x, 4, 2))
    torch.manual_seed(7)
    ours = q.moq_quantize(x, 4, 2, True, True)
    torch.manual_seed(7)
    g = x.reshape(2, -1)
    noise = torch.empty_like(g).uniform_(-0.5, 0.5)
    scale = 2 * torch.max(g.amin(-1, keepdim=True).abs(), g.amax(-1, keepdim=True).abs()) / 16
    expected = ((g / scale + noise).round().clamp(-8, 7) * scale).reshape(x.shape)
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, ref_symmetric(x, 4, 2))  # the noise moved some values to the other level
    assert torch.equal(q.moq_quantize(x, 2, 1, True, False), ref_ternary(x, 1))


def test_the_gradient_passes_straight_through():
    x = weights(4, 4, seed=4).requires_grad_()
    out = q.fake_quantize(x, q.SYMMETRIC, 4, 1)
    (out * torch.arange(16.0).view(4, 4)).sum().backward()
    assert torch.equal(x.grad, torch.arange(16.0).view(4, 4))
    scores = weights(10, seed=5).requires_grad_()
    mask = q.topk_mask(scores, 0.3)
    (mask * torch.arange(10.0)).sum().backward()
    assert torch.equal(scores.grad, torch.arange(10.0))


def test_one_valued_groups_stay_instead_of_nan():
    x = torch.cat([torch.zeros(8), weights(8, seed=6)])
    for kind in (q.SYMMETRIC, q.TERNARY, q.BINARY):
        out = q.quantize(x, kind, 4 if kind == q.SYMMETRIC else 2, 2)
        assert torch.equal(out[:8], torch.zeros(8)) and not out.isnan().any()
    const = torch.full((8,), 0.3)
    assert torch.equal(q.quantize(const, q.ASYMMETRIC, 4, 1), const)


def test_topk_mask_keeps_the_largest_ceil_ratio():
    scores = weights(7, 5, seed=8)
    mask = q.topk_mask(scores, 0.3)
    keep = math.ceil(0.3 * 35)
    assert mask.sum() == keep and set(mask.unique().tolist()) == {0.0, 1.0}
    assert scores[mask.bool()].min() > scores[~mask.bool()].max()
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        q.topk_mask(scores, 0.0)


@pytest.mark.parametrize("kind,bits,storage", [(q.SYMMETRIC, 8, 8), (q.ASYMMETRIC, 4, 4), (q.SYMMETRIC, 3, 4),
                                               (q.TERNARY, 2, 2), (q.BINARY, 1, 1)])
def test_packing_stores_the_bits_and_gives_the_values_back(kind, bits, storage):
    x = weights(128, 96, seed=9)
    values = q.quantize(x, kind, bits, 4)
    codes, codebook, stored = q.pack(values, 4)
    assert stored == storage
    assert codes.dtype == torch.uint8 and codes.numel() == math.ceil(values.numel() * storage / 8)
    assert torch.equal(q.unpack(codes, codebook, stored, list(values.shape)), values)
    assert codes.nbytes + codebook.nbytes < values.nbytes / (32 / storage) * 1.5
    pruned = values * (weights(128, 96, seed=10) > 0)  # pruning zeroes some: binary's third value
    codes, codebook, stored = q.pack(pruned, 4)
    assert stored == max(storage, 2) and torch.equal(q.unpack(codes, codebook, stored, list(values.shape)), pruned)
    assert q.pack(x, 1) is None  # 12288 distinct values: not a quantized tensor


# ---- init_compression and redundancy_clean -------------------------------------------------------------------------


def compressed(compression, steps=0, seed=0, forward=True, **config_args):
    """TinyLM through init_compression and an engine that trains `steps` steps (its first forward switches the
    offset-0 techniques on; with no steps, one forward does unless `forward` is false); (model, config, engine)."""
    torch.manual_seed(seed)
    model = TinyLM()
    config = ds_config(compression, **config_args)
    init_compression(model, config)
    engine, *_ = dscpp.initialize(model=model, config=config)
    for step in range(steps):
        engine.backward(engine(*batch(step, 4)))
        engine.step()
    if not steps and forward:
        engine(*batch(0, 4))
    return model, config, engine


def test_init_compression_makes_the_layers_compression_aware_with_deepspeeds_masks():
    torch.manual_seed(0)
    model = TinyLM()
    fc1 = model.blocks[0].fc1.weight.detach().clone()
    fc2 = model.blocks[0].fc2.weight.detach().clone()
    init_compression(model, ds_config(every_technique()))
    block = model.blocks[0]
    assert all(isinstance(m, LinearLayer_Compress) for m in (block.q, block.fc1, model.head))
    assert type(model.embed).__name__ == "Embedding_Compress"
    assert block.fc1.weight is not None and torch.equal(block.fc1.weight, fc1)  # the same tensors
    # sparse l1: the largest half of |fc2| by magnitude
    mask = block.fc2.sparse_pruning_mask
    assert mask.sum() == math.ceil(0.5 * fc2.numel()) and fc2.abs()[mask.bool()].min() > fc2.abs()[~mask.bool()].max()
    # row l1: the rows of fc1 with the largest L1 norms
    norms = fc1.abs().sum(dim=1)
    rows = block.fc1.row_pruning_mask.view(-1).bool()
    assert rows.sum() == math.ceil(0.75 * HIDDEN) and norms[rows].min() > norms[~rows].max()
    assert block.o.head_pruning_scores.shape == (1, HEADS)
    assert block.q.weight_bits == [8, 8, 1] and block.q.weight_quantize_num_groups == 2
    assert not block.q.weight_quantization_enabled  # the schedule switches it on


@pytest.mark.parametrize("weight_bits", [8, 2])
def test_redundancy_clean_removes_what_was_pruned_and_computes_the_same(weight_bits):
    model, config, engine = compressed(every_technique(weight_bits=weight_bits), steps=2)
    block = model.blocks[0]
    assert block.q.weight_quantization_enabled and block.fc1.row_pruning_enabled
    model.eval()
    ids, _ = batch(11, 3)
    with torch.no_grad():
        before = model(ids)
        heads = q.topk_mask(block.o.head_pruning_scores, 0.5).bool().view(-1)
        rows = block.fc1.get_mask("row").bool().view(-1)
        fake = block.q._quantized_weight().detach().clone()
    params_before = sum(p.numel() for p in model.parameters())
    redundancy_clean(model, config)
    with torch.no_grad():
        after = model(ids)
    assert (after - before).abs().max() < 1e-6
    kept_heads = int(heads.sum())
    width = DIM // HEADS
    assert kept_heads == 2 and block.o.weight.shape == (DIM, kept_heads * width)
    assert block.q.weight.shape == (kept_heads * width, DIM) and block.v.bias.shape == (kept_heads * width,)
    assert block.fc1.weight.shape == (int(rows.sum()), DIM) and block.fc2.weight.shape == (DIM, int(rows.sum()))
    assert torch.equal(block.q.weight, fake.view(HEADS, width, DIM)[heads].reshape(-1, DIM))
    assert sum(p.numel() for p in model.parameters()) < params_before
    assert not hasattr(block.fc2, "sparse_pruning_mask") and (block.fc2.weight == 0).any()


def test_a_quantized_layer_is_stored_packed_at_its_bits():
    compression = {"weight_quantization": technique({"wq": group(["fc1", "fc2"], start_bits=4, target_bits=4)},
                                                     quantize_weight_in_forward=True, schedule_offset=0)}
    model, config, _ = compressed(compression)
    layer = model.blocks[0].fc1
    with torch.no_grad():
        ids, _ = batch(3, 2)
        before = model(ids)
        fake = layer._quantized_weight().detach().clone()
    redundancy_clean(model, config)
    assert "weight" not in layer._parameters and layer.weight_codes.dtype == torch.uint8
    assert layer.weight_storage_bits == 4 and layer.weight_codes.numel() == fake.numel() // 2
    assert torch.equal(layer.weight, fake)
    with torch.no_grad():
        assert (model(ids) - before).abs().max() < 1e-6
    assert "blocks.0.fc1.weight_codes" in model.state_dict()


def test_channel_pruning_shrinks_the_convolution_and_its_batch_norm():
    torch.manual_seed(0)
    model = ConvNet()
    compression = {"channel_pruning": technique({"cp": group(["conv1"], related=[["bn1", "conv2"]],
                                                              dense_ratio=0.5)}, schedule_offset=0),
                   "activation_quantization": technique({"aq": group(["conv2"], bits=8)}, schedule_offset=0,
                                                        range_calibration="static")}
    config = ds_config(compression)
    init_compression(model, config)
    assert isinstance(model.conv1, Conv2dLayer_Compress) and type(model.bn1).__name__ == "BNLayer_Compress"
    engine, *_ = dscpp.initialize(model=model, config=config)
    x = weights(2, 3, 8, 8, seed=12)
    engine(x)  # switches them on; static calibration records the range
    model.eval()
    with torch.no_grad():
        before = model(x)
    redundancy_clean(model, config)
    assert model.conv1.weight.shape[0] == 4 and model.bn1.running_mean.shape == (4,)
    assert model.conv2.weight.shape[1] == 4
    with torch.no_grad():
        assert (model(x) - before).abs().max() < 1e-5


def test_each_technique_switches_on_at_its_schedule_offset():
    compression = every_technique()
    offsets = {"weight_quantization": 2, "sparse_pruning": 1, "row_pruning": 3, "head_pruning": 0,
               "activation_quantization": 4}
    for name, offset in offsets.items():
        compression[name]["shared_parameters"]["schedule_offset"] = offset
    torch.manual_seed(0)
    model = TinyLM()
    config = ds_config(compression)
    init_compression(model, config)
    engine, *_ = dscpp.initialize(model=model, config=config)
    block = model.blocks[1]
    flags = {"weight_quantization": lambda: block.q.weight_quantization_enabled,
             "sparse_pruning": lambda: block.fc2.sparse_pruning_enabled,
             "row_pruning": lambda: block.fc1.row_pruning_enabled,
             "head_pruning": lambda: block.o.head_pruning_enabled,
             "activation_quantization": lambda: model.head.activation_quantization_enabled}
    seen = []
    for step in range(6):
        engine.backward(engine(*batch(step, 4)))  # the first forward: "step zero"
        seen.append({name: flag() for name, flag in flags.items()})
        engine.step()
    for name, offset in offsets.items():
        assert [s[name] for s in seen] == [step >= offset for step in range(6)], name
    assert not model.blocks[0].fc1.sparse_pruning_enabled  # fc1 is in no sparse-pruning group


def moq_bits(steps, start, target, period, first_forwards=1):
    """MoQ's bits after each applied step, as DeepSpeed's runtime/quantize.py counts them: one quantize() call at each
    forward before the first step and one after each step; at call q (from 1) a weight above its target drops a bit
    once q >= its period, which then doubles (`q_period <<= 1`)."""
    bits, out = start, []
    for q in range(1, first_forwards + steps + 1):
        if bits != target and q >= period:
            bits, period = bits - 1, period << 1
        if q > first_forwards:
            out.append(bits)
    return out


@pytest.mark.parametrize("period,gas", [(2, 1), (2, 2), (0, 1)])
def test_moq_drops_the_bits_on_its_schedule(period, gas):
    """DeepSpeed quantizes at every forward before the first step (gas of them) and after each step."""
    compression = {"weight_quantization": technique({"wq": group(["fc1"], start_bits=6, target_bits=3,
                                                                 quantization_period=period)},
                                                     quantize_weight_in_forward=False, schedule_offset=0)}
    model, _, engine = compressed(compression, forward=False, dtype="bf16", gas=gas, micro=2)
    layer = model.blocks[0].fc1
    expected = moq_bits(6, 6, 3, period, first_forwards=gas)
    seen = []
    for step in range(6):
        for micro in range(gas):
            engine.backward(engine(*batch(10 * step + micro, 2)))
            engine.step()
        seen.append(layer.weight_bits[0])
        assert len(layer.weight.detach().float().unique()) <= 2 ** seen[-1]
    assert seen == expected and expected[-1] < 5  # bits dropped at least twice over the run
    assert model.blocks[1].fc1.weight_bits[0] == seen[-1]  # every layer of the group on the same schedule


def test_moq_quantizes_a_shared_weight_once():
    torch.manual_seed(0)
    model = TinyLM()
    model.blocks[1].fc1.weight = model.blocks[0].fc1.weight  # tied, as an LM head to its embedding
    compression = {"weight_quantization": technique({"wq": group(["fc1"], start_bits=4, target_bits=4)},
                                                     quantize_weight_in_forward=False, schedule_offset=0)}
    config = ds_config(compression, dtype="bf16")
    init_compression(model, config)
    engine, *_ = dscpp.initialize(model=model, config=config)
    before = model.blocks[0].fc1.weight.detach().clone()
    engine.compression_scheduler.quantize_weights()
    once = q.moq_quantize(before, 4, 1, True, False)
    assert torch.equal(model.blocks[0].fc1.weight.detach(), once)  # twice would move the clamped maximum


def test_a_resumed_run_has_the_techniques_on_that_the_saved_run_had(tmp_path):
    compression = {"row_pruning": technique({"g": group(["fc1"], dense_ratio=0.5)}, schedule_offset=2)}
    model, config, engine = compressed(compression, steps=3)
    assert model.blocks[0].fc1.row_pruning_enabled
    engine.save_checkpoint(str(tmp_path))
    torch.manual_seed(1)
    resumed = init_compression(TinyLM(), config)
    engine2, *_ = dscpp.initialize(model=resumed, config=config)
    assert not resumed.blocks[0].fc1.row_pruning_enabled
    engine2.load_checkpoint(str(tmp_path))
    assert resumed.blocks[0].fc1.row_pruning_enabled and engine2.global_steps == 3


def test_layer_reduction_takes_the_teachers_chosen_layers():
    torch.manual_seed(0)
    teacher, student = TinyLM(layers=4), TinyLM(layers=2)
    config = ds_config({"layer_reduction": {"enabled": True, "keep_number_layer": 2, "module_name_prefix": "blocks",
                                            "teacher_layer": [1, 3], "other_module_name": ["embed", "head"]}})
    init_compression(student, config, teacher_model=teacher)
    for s, t in ((student.blocks[0], teacher.blocks[1]), (student.blocks[1], teacher.blocks[3]),
                 (student.embed, teacher.embed), (student.head, teacher.head)):
        assert all(torch.equal(a, b) for a, b in zip(s.parameters(), t.parameters()))
    with pytest.raises(ValueError, match="needs teacher_model"):
        init_compression(TinyLM(layers=2), config)


@pytest.mark.parametrize("section,message", [
    ({"sparse_pruning": technique({"g": group(["fc"], dense_ratio=0.5)}, method="snip_momentum")},
     "snip_momentum runs Intel Neural Compressor"),
    ({"head_pruning": technique({"g": group(["o"], dense_ratio=0.5)}, method="l1", num_heads=4)},
     "head_pruning.shared_parameters.method"),
    ({"head_pruning": technique({"g": group(["o"], dense_ratio=0.5)})}, "num_heads"),
    ({"head_pruning": technique({"g": group(["o"], dense_ratio=0.5)}, num_heads=0)}, "num_heads = 0"),
    ({"row_pruning": technique({"g": {"modules": ["fc1"]}})}, "different_groups.g.params"),
    ({"row_pruning": technique({"g": group("fc1", dense_ratio=0.5)})}, "a list of regular expressions"),
    ({"weight_quantization": technique({"g": group(["q"], start_bits=4, target_bits=8)})}, "start_bits"),
    ({"weight_quantization": technique({"g": group(["q"], start_bits=2, target_bits=2)},
                                       quantization_type="asymmetric")}, "only symmetric"),
    ({"activation_quantization": technique({"g": group(["q"], bits=6)})}, "4 or 8"),
    ({"row_pruning": technique({"g": group(["fc1"], dense_ratio=1.5)})}, r"dense_ratio = 1.5: expected"),
    ({"row_pruning": technique({"g": group(["fc1"], dense_ratio=0.5, denseratio=1)})}, "did you mean"),
    ({"layer_reduction": {"enabled": True, "module_name_prefix": "blocks", "teacher_layer": [0, 1],
                          "keep_number_layer": 3}}, "keep_number_layer"),
])
def test_bad_config_is_refused_naming_the_key(section, message):
    with pytest.raises(ValueError, match=message):
        init_compression(TinyLM(), ds_config(section))


def test_a_model_init_compression_did_not_see_runs_uncompressed_and_says_so():
    """DeepSpeed's recipes build the teacher's engine from the student's config."""
    config = ds_config({"row_pruning": technique({"g": group(["fc1"], dense_ratio=0.5)})})
    teacher = TinyLM()
    with pytest.warns(UserWarning, match="did not go through dscpp.compression.init_compression, so it runs "
                                         "uncompressed"):
        engine, *_ = dscpp.initialize(model=teacher, config=config)
    assert engine.compression_scheduler is None and type(teacher.blocks[0].fc1) is torch.nn.Linear


def test_switched_off_techniques_may_name_what_is_refused_when_on():
    """DeepSpeedExamples' templates keep snip_momentum with enabled false."""
    section = {"sparse_pruning": {"shared_parameters": {"enabled": False, "method": "snip_momentum"},
                                  "different_groups": {}},
               "head_pruning": {"shared_parameters": {"enabled": False, "method": "l1"}}}
    init_compression(TinyLM(), ds_config(section))
    with pytest.raises(ValueError, match="quantizer_kernel"):
        init_compression(TinyLM(), ds_config({"weight_quantization": technique(
            {"g": group(["q"], start_bits=8, target_bits=8)}, quantizer_kernel=True)}))


def test_layers_inside_torch_modules_are_compressed_as_deepspeed_does():
    """nn.MultiheadAttention's out_proj is a Linear subclass computing as Linear: replaced like any Linear."""
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=HIDDEN, dropout=0.0, batch_first=True)
    x = weights(2, 5, DIM, seed=13)
    with torch.no_grad():
        before = model(x)
    config = ds_config({"weight_quantization": technique({"g": group(["linear1"], start_bits=8, target_bits=8)},
                                                         quantize_weight_in_forward=True, schedule_offset=0)})
    init_compression(model, config)
    assert isinstance(model.self_attn.out_proj, LinearLayer_Compress) and isinstance(model.linear1,
                                                                                     LinearLayer_Compress)
    with torch.no_grad():
        assert torch.equal(model(x), before)  # nothing switched on yet: the same computation


def test_moq_needs_fp32_masters_apart_from_the_weights():
    compression = {"weight_quantization": technique({"wq": group(["fc1"], start_bits=8, target_bits=4)})}
    with pytest.raises(dscpp.ConfigError, match="needs fp16 or bf16"):
        compressed(compression)


def test_two_processes_at_zero2_follow_one_process(tmp_path):
    """Every technique switching on during training: the 2-rank ZeRO-2 run's losses and final weights equal the
    1-rank run's on the same global batch."""
    results = []
    for world, stage in ((1, 0), (2, 2)):
        out = tmp_path / f"w{world}.json"
        run_ranks(world, ["compression_train.py", str(stage), str(out)])
        results.append(json.loads(out.read_text()))
    one, two = results
    assert len(one["losses"]) == 6
    assert max(abs(a - b) for a, b in zip(one["losses"], two["losses"])) < 1e-5, (one, two)
    # Adam amplifies the ranks' different summation order in near-zero gradients (the learned mask scores').
    assert abs(one["weights"] - two["weights"]) < 1e-5 * one["weights"] and one["shapes"] == two["shapes"]
    assert one["cleaned_equal"] and two["cleaned_equal"]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT_TRAIN = os.path.join(os.environ.get("DSCPP_BINARY_DIR", os.path.join(ROOT, "build")), "gpt-train")
TRAIN_GPT = os.path.join(ROOT, "examples", "python", "train_gpt.py")


def gpt_compression():
    """gpt-train's block layers: 4-bit weights of the attention's c_attn and the MLP's c_fc (on from step 1), l1
    row pruning of c_fc (from 0), l1 sparse pruning of the MLP's c_proj (from 2), static 8-bit activations into the
    attention's c_proj (from 1)."""
    return {
        "weight_quantization": technique({"wq": group([r"h\.\d+\.(attn\.c_attn|mlp\.c_fc)$"], start_bits=4,
                                                      target_bits=4)},
                                         quantize_weight_in_forward=True, schedule_offset=1, quantize_groups=4),
        "row_pruning": technique({"rp": group([r"mlp\.c_fc"], dense_ratio=0.75)}, schedule_offset=0),
        "sparse_pruning": technique({"sp": group([r"mlp\.c_proj"], dense_ratio=0.5)}, schedule_offset=2),
        "activation_quantization": technique({"aq": group([r"attn\.c_proj"], bits=8)}, schedule_offset=1,
                                             range_calibration="static"),
    }


def test_gpt_train_compresses_as_the_python_front_end(tmp_path):
    """The same GPT, data and compression_training from C++ (gpt-train) and from Python (train_gpt.py through
    init_compression): the same losses step by step, the techniques switching on mid-run."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                                  "steps_per_print": 100, "zero_optimization": {"stage": 1},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
                                  "compression_training": gpt_compression()}))
    def args(cfg, steps, metrics):
        return ["--model", "tiny", "--seq_len", "32", "--steps", str(steps), "--deepspeed_config", str(cfg),
                "--metrics", str(tmp_path / metrics)]

    def gpt_train(*extra):
        subprocess.run([GPT_TRAIN, *extra, "--no_progress"], check=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))

    def losses(metrics):
        return [json.loads(line)["loss"] for line in open(tmp_path / metrics)]

    gpt_train(*args(config, 5, "cpp.jsonl"))
    run_ranks(1, [TRAIN_GPT, *args(config, 5, "py.jsonl")])
    cpp = losses("cpp.jsonl")
    assert len(cpp) == 5 and losses("py.jsonl") == pytest.approx(cpp, abs=1e-5)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**json.loads(config.read_text()), "compression_training": {}}))
    gpt_train(*args(plain, 3, "plain.jsonl"))
    assert abs(losses("plain.jsonl")[2] - cpp[2]) > 1e-4  # the compression acts: step 3's loss is not the plain one


@pytest.mark.parametrize("section,flags,message", [
    ({"layer_reduction": {"enabled": True, "module_name_prefix": "h", "teacher_layer": [0]}}, [], "teacher model"),
    ({"weight_quantization": technique({"g": group(["wte"], start_bits=8, target_bits=8)},
                                       quantize_weight_in_forward=True)}, [], "not a Linear layer"),
    ({"weight_quantization": technique({"g": group(["c_fc"], start_bits=8, target_bits=4)})}, [],
     "needs fp16 or bf16"),
    ({"activation_quantization": technique({"g": group(["c_fc"], bits=8)}, range_calibration="static")},
     ["--activation_checkpointing"], "the recompute would move the running range a second time"),
    ({"row_pruning": technique({"g": group(["(?P<x>c_fc)"], dense_ratio=0.5)})}, [],
     "row_pruning.different_groups.g.modules: the pattern '(?P<x>c_fc)'"),
])
def test_gpt_train_refuses_what_it_does_not_compress(tmp_path, section, flags, message):
    path = tmp_path / "compression.json"
    path.write_text(json.dumps({"compression_training": section}))
    out = subprocess.run([GPT_TRAIN, "--model", "tiny", "--seq_len", "32", "--steps", "1", "--compression", str(path),
                          "--no_progress", *flags], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]


def test_gpt_train_resumes_its_compression_schedule(tmp_path):
    """Saved at step 3 and resumed to 5, gpt-train runs steps 4 and 5 with the techniques the uninterrupted run had
    on then (the schedule is put where the loaded run was)."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                                  "steps_per_print": 100, "zero_optimization": {"stage": 1},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                  "compression_training": gpt_compression()}))

    def gpt_train(steps, metrics, *extra):
        subprocess.run([GPT_TRAIN, "--model", "tiny", "--seq_len", "32", "--steps", str(steps), "--deepspeed_config",
                        str(config), "--metrics", str(tmp_path / metrics), "--no_progress", *extra], check=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return [json.loads(line)["loss"] for line in open(tmp_path / metrics)]

    whole = gpt_train(5, "whole.jsonl")
    ckpt = str(tmp_path / "ckpt")
    first = gpt_train(3, "first.jsonl", "--save_dir", ckpt)
    resumed = gpt_train(5, "resumed.jsonl", "--load_dir", ckpt)
    assert first == whole[:3] and resumed == pytest.approx(whole[3:], abs=1e-6), (whole, first, resumed)


def test_tensor_parallel_layers_compress_each_partition_as_deepspeed(tmp_path):
    """init_compression(mpu=...) on an mpu's ColumnParallelLinear / RowParallelLinear over 2 ranks: the output, the
    loss and each rank's weight gradients equal one process computing the same per-partition compression, and
    redundancy_clean removes each rank's pruned rows with the row-parallel layer's matching columns."""
    out = tmp_path / "tp.json"
    run_ranks(2, ["compression_tp.py", str(out)])
    results = json.loads(out.read_text())
    for result in results:
        assert all(result["ok"].values()) and result["type"] == "ColumnParallelLinear_Compress", results
        assert result["shapes"] == [[4, 8], [8, 4]], results
