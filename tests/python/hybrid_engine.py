"""A rank of DeepSpeed-Chat's actor on the hybrid engine: a tiny Hugging Face LLaMA whose q and v projections carry
DeepSpeed-Chat-shaped LoRA layers (base frozen), trained 2 steps through dscpp.initialize with hybrid_engine
enabled, then generate() — greedy, and sampled — then one more training step. Rank 0 writes to OUT: whether the
greedy tokens are those of the whole model (gathered into a plain copy, generating unfused), whether every weight
is bit for bit what it was before generate(), how many gathers (all-gathers, all-reduces) generate() issued against
the parameter count and against one forward's,
whether both ranks sampled the same tokens (each seeded differently before initialize), and the losses.

    python3 hybrid_engine.py STAGE PIN OUT [TP]      (torchrun's environment; PIN: pin_parameters, 1 or 0)

With TP (hybrid_engine.inference_tp_size), each rank generates prompts of its own (the group concatenates them and
generates over sliced layers), so the whole model's tokens are those of this rank's prompts; rank 0 then also
writes whether the model's own modules and head counts are back after generate().
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers

import dscpp
from dscpp.zero import GatheredParameters

VOCAB, RANK_R = 64, 4


class LinearLayer_LoRA(torch.nn.Module):
    """DeepSpeed-Chat's LoRA layer (its utils/module/lora.py, written out): y = x·Wᵀ + b + (x·R·L)·scaling, and
    fuse_lora_weight / unfuse_lora_weight folding R·L into W for generation."""

    def __init__(self, weight, bias, r=RANK_R, alpha=8):
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        out_features, in_features = weight.shape
        self.lora_right_weight = torch.nn.Parameter(torch.randn(in_features, r) / r)
        self.lora_left_weight = torch.nn.Parameter(torch.zeros(r, out_features))
        self.lora_scaling = alpha / r
        self.fuse_lora = False

    def fuse_lora_weight(self):
        if not self.fuse_lora:
            self.weight.data += self.lora_scaling * torch.matmul(self.lora_left_weight.t(), self.lora_right_weight.t())
        self.fuse_lora = True

    def unfuse_lora_weight(self):
        if self.fuse_lora:
            self.weight.data -= self.lora_scaling * torch.matmul(self.lora_left_weight.t(), self.lora_right_weight.t())
        self.fuse_lora = False

    def forward(self, x):
        if self.fuse_lora:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) + (x @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling


def make_model():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))
    for layer in model.model.layers:
        for name in ("q_proj", "v_proj"):
            linear = getattr(layer.self_attn, name)
            setattr(layer.self_attn, name, LinearLayer_LoRA(linear.weight, linear.bias))
    return model


def whole_state(model):
    """Every parameter's whole value, by name (collective under ZeRO-3)."""
    with GatheredParameters(list(model.parameters())):
        return {name: p.data.clone() for name, p in model.named_parameters()}


def collectives(engine):
    """The engine's parameter collectives so far, by the comms logger: ZeRO-3 gathers a block with an all-gather and
    assembles one parameter whole (GatheredParameters) with an all-reduce of its fragments."""
    totals = engine._engine.comm_totals
    return sum(totals.get(op, (0, 0))[0] for op in ("all_gather", "all_reduce"))


def modules_and_counts(model):
    """Each module's name, identity and the head / width counts AutoTP divides while sliced."""
    from dscpp.module_inject.auto_tp import SHARDED_ATTRIBUTES
    return [(n, id(m), [getattr(m, a, None) for a in SHARDED_ATTRIBUTES + ("num_key_value_groups",)])
            for n, m in model.named_modules()]


def main(stage, pin, out, tp="1"):
    tp = int(tp)
    dscpp.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = make_model()
    plain = copy.deepcopy(model)
    torch.manual_seed(100 + rank)  # different on each rank: the hybrid engine gives every rank rank 0's state
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": int(stage), "stage3_param_persistence_threshold": 0},
              "comms_logger": {"enabled": True},
              "hybrid_engine": {"enabled": True, "pin_parameters": pin == "1", "max_out_tokens": 32,
                                "inference_tp_size": tp}}
    engine, _, _, _ = dscpp.initialize(model=model, model_parameters=model.parameters(), config=config)
    assert type(engine).__name__ == "DeepSpeedHybridEngine"
    data = torch.Generator().manual_seed(5 + rank)
    losses = []

    def train_step():
        ids = torch.randint(1, VOCAB, (2, 8), generator=data)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())

    for _ in range(2):
        train_step()

    # Sliced, the ranks' prompts differ (the group generates them as one batch); every row runs all 8 tokens, as
    # a row that ends early alone would be padded while the batch goes on.
    prompts = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9 + (rank if tp > 1 else 0)))
    lengths = dict(max_new_tokens=8, min_new_tokens=8 if tp > 1 else 0)
    before = whole_state(engine.module)
    plain.load_state_dict(before)
    plain.eval()
    expected = plain.generate(input_ids=prompts, do_sample=False, pad_token_id=0, **lengths).tolist()
    own_modules = modules_and_counts(engine.module)

    engine.eval()
    calls_before = collectives(engine)
    with torch.no_grad():
        engine(input_ids=prompts)  # one forward: each group gathered once
    forward_gathers = collectives(engine) - calls_before
    calls_before = collectives(engine)
    attention = engine.module.model.layers[0].self_attn
    seen = set()  # the projections' kinds while generate() runs (AutoTP's sliced layers with TP)
    probe = attention.register_forward_pre_hook(
        lambda m, args: seen.update(type(getattr(m, n)).__name__ for n in ("q_proj", "k_proj", "o_proj")))
    greedy = engine.generate(input_ids=prompts, do_sample=False, pad_token_id=0, **lengths).tolist()
    probe.remove()
    modules_back = own_modules == modules_and_counts(engine.module)
    gathers = collectives(engine) - calls_before
    after = whole_state(engine.module)
    if tp > 1:
        # The ranks' random states part here on purpose (as dropout on batches of other shapes would part them): at
        # the call the group's first rank gives its state to the others, so the group samples its batch as the whole
        # model does from that state.
        everyone_prompts = [None] * dist.get_world_size()
        dist.all_gather_object(everyone_prompts, prompts.tolist())
        torch.manual_seed(1000)  # rank 0's state at the call
        reference = plain.generate(input_ids=torch.tensor(sum(everyone_prompts, [])), do_sample=True, top_k=20,
                                   pad_token_id=0, **lengths).tolist()[2 * rank:2 * rank + 2]
        torch.manual_seed(1000 + rank)
        sampled = engine.generate(input_ids=prompts, do_sample=True, top_k=20, pad_token_id=0, **lengths).tolist()
    else:
        sampled = engine.generate(input_ids=prompts, max_new_tokens=8, do_sample=True, top_k=20,
                                  pad_token_id=0).tolist()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sampled)
    engine.train()
    train_step()  # the hooks are back: training goes on

    result = {"tokens_equal": greedy == expected, "greedy": greedy, "expected": expected,
              "weights_unchanged": all(torch.equal(before[n], after[n]) for n in before),
              "gathers": gathers, "forward_gathers": forward_gathers,
              "params": sum(1 for _ in engine.module.parameters()),
              # Sliced, each rank's rows are the whole model's sampling of the group's batch from the group's first
              # rank's state; else every rank samples alike.
              "sampled_agree": sampled == reference if tp > 1 else all(s == everyone[0] for s in everyone),
              "losses": losses,
              "fused_after": any(getattr(m, "fuse_lora", False) for m in engine.module.modules()),
              "modules_back": modules_back, "layers_seen": sorted(seen)}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
