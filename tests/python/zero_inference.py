"""A rank of ZeRO-Inference (DeepSpeed's recipe: dscpp.initialize with ZeRO-3 and offload_param, no optimizer, then
the model's own generate): a tiny Hugging Face LLaMA (seeded: every rank builds the same one) generates greedily
from left-padded prompts of unequal length with its weights on DEVICE, streamed block by block. Rank 0 writes to OUT
whether the tokens are the whole model's (a plain copy, generating in memory) and the engine's memory report.

    python3 zero_inference.py DEVICE NVME_DIR OUT     (torchrun's environment; DEVICE none | cpu | nvme)
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
import transformers

import dscpp


def main(device, nvme_dir, out):
    dscpp.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))
    model.eval()
    plain = copy.deepcopy(model)
    # Blocks released as their forward ends (DeepSpeed's ZeRO-Inference settings): what is gathered at once is one
    # block and the root (embedding, head), not the model.
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 1,
            "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
    if device != "none":
        zero["offload_param"] = {"device": device, "nvme_path": nvme_dir} if device == "nvme" else {"device": device}
    engine, _, _, _ = dscpp.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1,
                                                             "zero_optimization": zero})
    ids = torch.randint(1, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids = ids.masked_fill(mask == 0, 0)
    settings = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        tokens = engine.module.generate(input_ids=ids, **settings).tolist()
        expected = plain.generate(input_ids=ids, **settings).tolist()
    largest_block = max(sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in plain.model.layers)
    result = {"tokens_equal": tokens == expected, "tokens": tokens, "memory": engine.memory(),
              "model_bytes": sum(p.numel() * p.element_size() for p in plain.parameters()),
              "largest_block_bytes": largest_block}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
