"""A rank of dscpp.init_inference with AutoTP: a tiny model (made here, seeded: every rank builds the same one) runs
whole as the reference, then sliced over tensor_parallel.tp_size = the world; rank 0 writes to OUT the largest
difference of the logits, whether greedy and seeded-sampling generate (batched prompts of unequal length, left
padded) gave the reference's tokens, and how many parameter elements each rank holds against the whole model.

    python3 auto_tp.py MODEL OUT [TP [checkpoint]]  (torchrun's environment; MODEL llama | gpt2 | custom; TP: the world)
custom is a model whose row-parallel layer AutoTP cannot find by name; it is named by injection_policy. With
`checkpoint`, the sliced model is built on the meta device (dscpp.OnDevice) and its weights come from init_inference's
`checkpoint`: the reference's state dict saved in two shards (a torch file and a safetensors file, the tied head
left out as Hugging Face's save_pretrained leaves it) and DeepSpeed's description of them; rank 0 also writes the most
bytes CPU tensors held at once during init_inference (counted by the engine's allocator count, beyond what was held
before) against the whole model's bytes."""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

import dscpp

VOCAB = 64


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.widen = torch.nn.Linear(dim, 4 * dim)
        self.narrow = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.narrow(torch.relu(self.widen(x)))


class Custom(torch.nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, dim)
        self.layers = torch.nn.ModuleList([Block(dim) for _ in range(2)])
        self.lm_head = torch.nn.Linear(dim, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def make(kind):
    torch.manual_seed(0)
    if kind == "custom":
        return Custom(), {"injection_policy": {Block: ("narrow",)}}
    import transformers
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          pad_token_id=0)
        return transformers.LlamaForCausalLM(config), {}
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     pad_token_id=0)
    return transformers.GPT2LMHeadModel(config), {}


def logits_of(model, ids):
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def save_shards(model, directory, tied_head):
    """The model's state dict in two shard files under `directory` (without lm_head.weight when it is the embedding's,
    as save_pretrained writes it), and DeepSpeed's description of them."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    state = {k: v.clone() for k, v in model.state_dict().items() if not (tied_head and k == "lm_head.weight")}
    names = sorted(state)
    torch.save({k: state[k] for k in names[:len(names) // 2]}, os.path.join(directory, "part-1.bin"))
    save_file({k: state[k].contiguous() for k in names[len(names) // 2:]}, os.path.join(directory, "part-2.safetensors"))
    return {"type": "ds_model", "checkpoints": ["part-1.bin", "part-2.safetensors"], "version": 1.0}



def main(kind, out, tp=None, checkpoint=None):
    dscpp.init_distributed(dist_backend="gloo")
    tp = int(tp) if tp else dist.get_world_size()
    model, extra = make(kind)
    model.eval()
    whole = copy.deepcopy(model)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 7))
    if checkpoint:
        directory = os.path.join(os.path.dirname(out), f"shards_rank{dist.get_rank()}")
        extra["checkpoint"] = save_shards(whole, directory, tied_head=kind == "gpt2")
        extra["base_dir"] = directory
        with dscpp.OnDevice(dtype=torch.float32, device="meta"):
            model, _ = make(kind)
        assert all(p.is_meta for p in model.parameters())
        model.eval()
    if checkpoint:
        dscpp._C.memory.install()
        dscpp._C.memory.reset_peak()
        held_before = dscpp._C.memory.allocated()
    engine = dscpp.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": tp}, **extra)
    if checkpoint:
        load_peak = dscpp._C.memory.peak() - held_before
    with torch.no_grad():
        difference = (logits_of(engine, ids) - logits_of(whole, ids)).abs().max().item()
    result = {"logits": difference, "elements": sum(p.numel() for p in engine.parameters()),
              "whole_elements": sum(p.numel() for p in whole.parameters())}
    if kind != "custom":
        # Prompts of 7, 5 and 3 tokens, left-padded, as a batch.
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        mask[2, :4] = 0
        prompts = ids.masked_fill(mask == 0, 0)
        settings = {"greedy": dict(do_sample=False), "sampled": dict(do_sample=True, top_k=20, top_p=0.9)}
        for name, setting in settings.items():
            tokens = []
            for m in (engine, whole):
                torch.manual_seed(7)  # the same seed on every rank: every rank samples the same tokens
                tokens.append(m.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=6, pad_token_id=0,
                                         **setting).tolist())
            result[name] = tokens[0] == tokens[1]
            result[name + "_tokens"] = tokens[0]
    result["tp"] = engine.mp_world_size
    if checkpoint:
        unique = {t.data_ptr(): t for t in whole.state_dict().values()}.values()  # a tied weight once
        result["load_peak_bytes"] = load_peak
        result["whole_bytes"] = sum(t.numel() * t.element_size() for t in unique)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
