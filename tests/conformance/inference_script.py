"""init_inference with automatic tensor parallelism, one user script on real DeepSpeed and on deepspeed.cpp
(tests/conformance/test_inference.py): `--impl` picks the module that plays `deepspeed`.

Every rank builds the same tiny Hugging Face model (seeded, made from its config: nothing downloaded), hands it to
init_inference(dtype=torch.float32, tensor_parallel={"tp_size": world}), and runs one forward and a greedy generate
over a batch of left-padded prompts of unequal length. Rank 0 prints one JSON line: the logits (a list of floats)
and the generated tokens. With --checkpoint DIR the model is built on the meta device (OnDevice) and its weights come
from init_inference's `checkpoint`: the seeded model's state dict, which rank 0 first saves under DIR in two shards
(a torch file and a safetensors file), and DeepSpeed's description of them.

    python inference_script.py --impl deepspeed|dscpp --model llama|gpt2 [--checkpoint DIR]
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import transformers

p = argparse.ArgumentParser()
p.add_argument("--impl", choices=["deepspeed", "dscpp"], required=True)
p.add_argument("--model", choices=["llama", "gpt2"], required=True)
p.add_argument("--checkpoint", default=None)
args = p.parse_args()

if args.impl == "deepspeed":
    import ds_cpu  # noqa: F401  (real DeepSpeed on CPU with Gloo; see ds_cpu.py)
    import deepspeed
    ds_cpu.without_shared_memory_all_reduce()
else:
    import dscpp as deepspeed

deepspeed.init_distributed(dist_backend="gloo")
VOCAB = 64


def make():
    torch.manual_seed(0)
    if args.model == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                                n_positions=64, pad_token_id=0))


extra = {}
if args.checkpoint:
    if dist.get_rank() == 0:
        from safetensors.torch import save_file
        os.makedirs(args.checkpoint, exist_ok=True)
        state = make().state_dict()
        names = sorted(state)
        torch.save({k: state[k] for k in names[:len(names) // 2]}, os.path.join(args.checkpoint, "part-1.bin"))
        save_file({k: state[k].contiguous() for k in names[len(names) // 2:]},
                  os.path.join(args.checkpoint, "part-2.safetensors"))
    dist.barrier()
    extra = {"checkpoint": {"type": "ds_model", "checkpoints": ["part-1.bin", "part-2.safetensors"], "version": 1.0},
             "base_dir": args.checkpoint}
    with deepspeed.OnDevice(dtype=torch.float32, device="meta"):
        model = make()
else:
    model = make()
model.eval()
engine = deepspeed.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": dist.get_world_size()},
                                  **extra)

torch.manual_seed(1)
ids = torch.randint(1, VOCAB, (3, 7))
mask = torch.ones_like(ids)
mask[1, :2] = 0
mask[2, :4] = 0
ids = ids.masked_fill(mask == 0, 0)
with torch.no_grad():
    logits = engine(input_ids=ids, attention_mask=mask).logits
tokens = engine.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
if dist.get_rank() == 0:
    print(json.dumps({"logits": logits.reshape(-1).tolist(), "tokens": tokens.tolist()}))
