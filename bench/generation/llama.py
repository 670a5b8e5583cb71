"""The model the generation benches share: a LLaMA-shaped Hugging Face model made from its config (nothing
downloaded), seeded, in eval mode; its MLP width rounded to 64 so that it splits over tensor-parallel ranks."""
import torch
import transformers

VOCAB = 8000


def add_arguments(p):
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--local_rank", type=int, default=0)  # passed by the launcher, as DeepSpeed's passes it


def make(args):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=(args.hidden * 8 // 3 + 63) // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
        pad_token_id=0))
    return model.eval()
