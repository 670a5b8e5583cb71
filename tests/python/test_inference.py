"""dscpp.init_inference (issue 54): AutoTP slices a model over real processes and gives the whole model's logits and
tokens (auto_tp.py), and the config's and the slicer's errors name what is wrong. Real DeepSpeed on the same script:
tests/conformance/test_inference.py."""
import json

import pytest
import torch

import dscpp
from conftest import run_ranks
from dscpp.module_inject import auto_tp


@pytest.mark.parametrize("kind,world,tp", [("llama", 2, 2), ("gpt2", 2, 2), ("custom", 2, 2), ("llama", 4, 2)])
def test_tensor_parallel_model_gives_the_whole_ones_logits_and_tokens(kind, world, tp, tmp_path):
    out = tmp_path / "result.json"
    run_ranks(world, ["auto_tp.py", kind, str(out), str(tp)])
    result = json.loads(out.read_text())
    assert result["tp"] == tp
    assert result["logits"] < 1e-5, result
    # Sliced: each rank holds little more than its share (norms, position embeddings and biases stay whole).
    assert result["elements"] < result["whole_elements"] * 0.6, result
    if kind != "custom":  # HF generate: greedy, and sampling with top-k / top-p under one seed on every rank
        assert result["greedy"] and result["sampled"], result


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_meta_model_takes_its_weights_from_the_checkpoint_description(kind, tmp_path):
    """init_inference's checkpoint (DeepSpeed's {"type": "ds_model", "checkpoints": [...]}, under base_dir) fills a
    model built on the meta device from a torch file and a safetensors file, GPT-2's tied head re-tied to its
    embedding; sliced over 2 ranks it gives the whole model's logits and tokens. The shards are mapped, not read into
    the rank's memory: the most its CPU tensors held during init_inference is its share of the model, not the whole
    (about half at tp 2, plus the layer being sliced; reading the files whole holds at least all of it)."""
    out = tmp_path / "result.json"
    run_ranks(2, ["auto_tp.py", kind, str(out), "2", "checkpoint"])
    result = json.loads(out.read_text())
    assert result["tp"] == 2 and result["logits"] < 1e-5, result
    assert result["greedy"] and result["sampled"], result
    assert 0 < result["load_peak_bytes"] < 0.75 * result["whole_bytes"], result


def _tiny_shards(tmp_path, state, description=None):
    torch.save(state, tmp_path / "w.bin")
    return description or {"type": "ds_model", "checkpoints": ["w.bin"], "version": 1.0}


@pytest.mark.parametrize("change,message", [
    (lambda s: s.pop("1.bias"), r"no checkpoint shard holds 1 of the model's tensors .*'1.bias'"),
    (lambda s: s.update(extra=torch.zeros(1)), r"holds 1 tensor\(s\) the model does not have: \['extra'\]"),
])
def test_a_checkpoint_that_does_not_fit_the_model_is_named(change, message, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    change(state)
    with pytest.raises(ValueError, match=message):
        dscpp.init_inference(model, dtype=torch.float32, checkpoint=_tiny_shards(tmp_path, state),
                             base_dir=str(tmp_path))


@pytest.mark.parametrize("description,message", [
    ({"type": "Megatron", "checkpoints": ["w.bin"], "version": 1.0}, r"checkpoint type 'Megatron' is not supported"),
    ({"type": "ds_model", "checkpoints": ["w.bin"]}, r"has no 'version'"),
    ({"type": "ds_model", "checkpoints": ["gone.bin"], "version": 1.0}, r"gone.bin does not exist"),
    ({"type": "ds_model", "checkpoints": [], "version": 1.0}, r"must be a non-empty list"),
])
def test_a_bad_checkpoint_description_is_named(description, message, tmp_path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=message):
        dscpp.init_inference(model, dtype=torch.float32, base_dir=str(tmp_path),
                             checkpoint=_tiny_shards(tmp_path, model.state_dict(), description))


def test_a_safetensors_shard_is_mapped_as_its_header_says_and_a_broken_one_is_named(tmp_path):
    """The safetensors reader (the format's header, the file mapped privately): a bf16 weight and an fp32 bias land
    in the model as saved, a write to the loaded (mapped) bias never reaches the file, and a file that is no safetensors
    file, or whose header promises bytes it does not hold, is named."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    torch.manual_seed(3)
    saved = {"weight": torch.randn(4, 6).to(torch.bfloat16), "bias": torch.randn(4)}
    save_file(saved, tmp_path / "w.safetensors")
    description = {"type": "ds_model", "checkpoints": ["w.safetensors"], "version": 1.0}
    with dscpp.OnDevice(dtype=torch.float32, device="meta"):
        model = torch.nn.Linear(6, 4)
    dscpp.init_inference(model, dtype=torch.float32, checkpoint=description, base_dir=str(tmp_path))
    assert torch.equal(model.weight, saved["weight"].float()) and torch.equal(model.bias, saved["bias"])
    with torch.no_grad():
        model.bias.add_(1)  # a private mapping: the file keeps its values
    again = torch.nn.Linear(6, 4)
    dscpp.init_inference(again, dtype=torch.float32, checkpoint=description, base_dir=str(tmp_path))
    assert torch.equal(again.bias, saved["bias"])

    raw = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match=r"w.safetensors is not a safetensors file"):
        dscpp.init_inference(torch.nn.Linear(6, 4), checkpoint=description, base_dir=str(tmp_path))
    (tmp_path / "w.safetensors").write_bytes(raw[:-8])  # the last tensor's bytes cut short
    with pytest.raises(ValueError, match=r"w.safetensors: tensor '.*' .* which do not hold it"):
        dscpp.init_inference(torch.nn.Linear(6, 4), checkpoint=description, base_dir=str(tmp_path))


def test_a_shard_that_pickles_an_object_is_refused_unrun(tmp_path):
    model = torch.nn.Linear(4, 4)
    torch.save({"weight": model.weight.detach(), "bias": model.bias.detach(), "note": _Size3()}, tmp_path / "w.bin")
    with pytest.raises(ValueError, match=r"w.bin holds a pickled object"):
        dscpp.init_inference(model, dtype=torch.float32, base_dir=str(tmp_path),
                             checkpoint={"type": "ds_model", "checkpoints": ["w.bin"], "version": 1.0})


def _llama(heads=4, kv_heads=2, intermediate=64):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=intermediate, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=32))


def test_autotp_finds_each_linears_role():
    the_plan = auto_tp.plan(_llama(), 2)
    roles = {name.split(".", 3)[-1]: role for name, role in the_plan.linears.items()}
    assert roles == {"self_attn.q_proj": "column", "self_attn.k_proj": "column", "self_attn.v_proj": "column",
                     "self_attn.o_proj": "row", "mlp.gate_proj": "column", "mlp.up_proj": "column",
                     "mlp.down_proj": "row"}
    assert (the_plan.embedding, the_plan.head) == ("model.embed_tokens", "lm_head")
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=63, n_embd=16, n_layer=1, n_head=2))
    the_plan = auto_tp.plan(gpt2, 2)
    assert {n.split(".", 3)[-1]: r for n, r in the_plan.linears.items()} == {
        "attn.c_attn": "fused", "attn.c_proj": "row", "mlp.c_fc": "column", "mlp.c_proj": "row"}
    assert (the_plan.embedding, the_plan.head) == (None, None)  # 63 rows do not divide: the vocabulary stays whole


class _Size3:
    """What apply reads of a Comm before any collective: a group of 3."""
    rank, world_size = 0, 3


def test_sizes_that_do_not_divide_are_named_and_the_model_is_left_whole():
    model = _llama(heads=4, kv_heads=4, intermediate=48)  # the MLP divides over 3; 4 heads of 12 do not
    before = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"self_attn.k_proj has out_features 48, which does not divide over "
                                         r"tensor_parallel.tp_size 3 in whole heads of 12"):
        auto_tp.apply(model, auto_tp.plan(model, 3), _Size3())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)


def test_injection_policy_must_name_the_blocks_linears():
    model = _llama()
    block = type(model.model.layers[0])
    with pytest.raises(ValueError, match=r"injection_policy names \['mlp.down'\] for LlamaDecoderLayer"):
        auto_tp.plan(model, 2, {block: ("self_attn.o_proj", "mlp.down")})
    with pytest.raises(ValueError, match="has no nn.ModuleList of blocks"):
        auto_tp.plan(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2)


@pytest.mark.parametrize("kwargs,message", [
    (dict(replace_with_kernel_inject=True), "replace_with_kernel_inject=True is not supported: it swaps"),
    (dict(kernel_inject=True), "replace_with_kernel_inject=True is not supported"),
    (dict(enable_cuda_graph=True), "enable_cuda_graph=True is not supported"),
    (dict(checkpoint="ckpt.json"), "checkpoint 'ckpt.json': cannot read it"),
    (dict(checkpoint_config={"tp_size": 2}), "checkpoint_config=.* is not supported: it configures the injected"),
    (dict(dtype=torch.int8), "dtype torch.int8 is not supported"),
    (dict(dtype="fp8"), "dtype 'fp8' is not supported"),
    (dict(tensor_parallel={"tp_size": 0}), "tensor_parallel.tp_size must be a positive integer, not 0"),
    (dict(tensor_parallel={"size": 2}), r"unknown tensor_parallel key\(s\) \['size'\]"),
    (dict(tensor_parallel={"tp_size": 2}, mp_size=4), "mp_size 4 .deprecated. and tensor_parallel.tp_size 2 differ"),
    (dict(max_tokens=0), "max_out_tokens must be a positive integer, not 0"),
    (dict(dtpye=torch.half), r"unknown config key\(s\) \['dtpye'\]"),
])
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dscpp.init_inference(torch.nn.Linear(2, 2), **kwargs)


def test_config_and_keyword_arguments_must_agree(tmp_path):
    path = tmp_path / "inference.json"
    path.write_text(json.dumps({"dtype": "fp32", "max_out_tokens": 8}))
    engine = dscpp.init_inference(torch.nn.Linear(2, 2).half(), config=str(path), max_out_tokens=8)
    assert engine.module.weight.dtype == torch.float32  # dtype acts
    with pytest.raises(ValueError, match=r"\['max_out_tokens'\] given in config and as keyword arguments"):
        dscpp.init_inference(torch.nn.Linear(2, 2), config=str(path), max_out_tokens=9)


def test_a_prompt_longer_than_max_out_tokens_is_refused():
    engine = dscpp.init_inference(_llama(), dtype=torch.float32, max_out_tokens=4)
    with pytest.raises(RuntimeError, match="a prompt of 5 tokens exceeds max_out_tokens 4"):
        engine.generate(input_ids=torch.ones(1, 5, dtype=torch.long), max_new_tokens=1)
    assert engine.generate(input_ids=torch.ones(1, 4, dtype=torch.long), max_new_tokens=2,
                           do_sample=False).shape == (1, 6)


@pytest.mark.parametrize("device", ["none", "cpu", "nvme"])
def test_zero_inference_streams_the_weights_and_gives_the_whole_models_tokens(device, tmp_path):
    """ZeRO-Inference (zero_inference.py): ZeRO-3 without an optimizer, weights in memory, in host memory or on NVMe,
    2 processes: generate gives the whole model's greedy tokens while never more than one module's weights are
    gathered at once, and a rank holds its half of the weights and nothing for training — on NVMe not even that."""
    out = tmp_path / "result.json"
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    run_ranks(2, ["zero_inference.py", device, str(nvme), str(out)])
    result = json.loads(out.read_text())
    assert result["tokens_equal"], result
    memory = result["memory"]
    assert 0 < memory["gathered_peak"] <= result["largest_block_bytes"], result
    # Forward only: every parameter held as a frozen one, so no gradient partition, fp32 master or optimizer state
    # (the empty trainable layout keeps one padding element per rank); its weights are all frozen ones, which
    # memory_breakdown counts among the params too.
    trained = memory["params"] - memory["frozen"]
    assert memory["grads"] + memory["master"] + memory["optimizer_state"] + trained <= 16, result
    if device == "nvme":
        assert memory["frozen"] == 0, result  # the shards are in the swap file
    else:
        assert memory["frozen"] == result["model_bytes"] // 2, result  # this rank's half


class _Rank:
    """What slicing reads of a Comm (no collective runs while slicing): rank 1 of 2."""
    rank, world_size = 1, 2


class _Attention(torch.nn.Module):
    """Phi-3's shape: one fused q|k|v projection under grouped-query attention (4 heads, 2 key/value heads of 8)."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()
        self.head_dim = 8
        self.qkv_proj = torch.nn.Linear(32, (4 + 2 + 2) * 8)
        self.o_proj = torch.nn.Linear(32, 32)


class _Mlp(torch.nn.Module):
    def __init__(self, linear=torch.nn.Linear):
        super().__init__()
        self.gate_up_proj = linear(32, 2 * 64)
        self.down_proj = torch.nn.Linear(64, 32)


class _Fused(torch.nn.Module):
    def __init__(self, linear=torch.nn.Linear):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"self_attn": _Attention(), "mlp": _Mlp(linear)})])


def test_fused_projections_are_split_per_part():
    model = _Fused()
    qkv = model.layers[0]["self_attn"].qkv_proj.weight.detach().clone()
    gate_up = model.layers[0]["mlp"].gate_up_proj.weight.detach().clone()
    auto_tp.apply(model, auto_tp.plan(model, 2), _Rank())
    # Rank 1 of 2: the second half of q's 32 rows, of k's 16 and of v's 16; of gate's 64 and of up's 64.
    want = torch.cat([qkv[16:32], qkv[40:48], qkv[56:64]])
    assert torch.equal(model.layers[0]["self_attn"].qkv_proj.weight, want)
    assert torch.equal(model.layers[0]["mlp"].gate_up_proj.weight, torch.cat([gate_up[32:64], gate_up[96:128]]))


def test_what_autotp_cannot_slice_is_named():
    class QuantizedLinear(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2
    with pytest.raises(ValueError, match="gate_up_proj is a QuantizedLinear, a subclass of nn.Linear"):
        model = _Fused(QuantizedLinear)
        auto_tp.apply(model, auto_tp.plan(model, 2), _Rank())
    model = _Fused()
    model.layers[0]["self_attn"].W_pack = torch.nn.Linear(32, 96)
    with pytest.raises(ValueError, match=r"W_pack is a fused projection \(W_pack\) whose layout differs by model"):
        auto_tp.plan(model, 2)
    with pytest.raises(ValueError, match=r"injection_policy names \['Linear'\], which is no block of this model"):
        auto_tp.plan(_Fused(), 2, {torch.nn.Linear: ("o_proj",)})
