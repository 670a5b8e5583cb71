"""init_inference with automatic tensor parallelism, one user script on real DeepSpeed and on deepspeed.cpp
(tests/conformance/test_inference.py): `--impl` picks the module that plays `deepspeed`.

Every rank builds the same tiny Hugging Face model (seeded, made from its config: nothing downloaded), hands it to
init_inference(dtype=torch.float32, tensor_parallel={"tp_size": world}), and runs one forward and a greedy generate
over a batch of left-padded prompts of unequal length. Rank 0 prints one JSON line: the logits (a list of floats)
and the generated tokens.

    python inference_script.py --impl deepspeed|dscpp --model llama|gpt2
"""
import argparse
import json

import torch
import torch.distributed as dist
import transformers

p = argparse.ArgumentParser()
p.add_argument("--impl", choices=["deepspeed", "dscpp"], required=True)
p.add_argument("--model", choices=["llama", "gpt2"], required=True)
args = p.parse_args()

if args.impl == "deepspeed":
    import ds_cpu  # noqa: F401  (real DeepSpeed on CPU with Gloo; see ds_cpu.py)
    import deepspeed
    ds_cpu.without_shared_memory_all_reduce()
else:
    import dscpp as deepspeed

deepspeed.init_distributed(dist_backend="gloo")
VOCAB = 64
torch.manual_seed(0)
if args.model == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))
else:
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                                 n_positions=64, pad_token_id=0))
model.eval()
engine = deepspeed.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": dist.get_world_size()})

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
