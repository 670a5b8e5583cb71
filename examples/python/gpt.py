"""gpt-train's GPT in plain PyTorch, and its data: the model of examples/python/train_gpt.py and of the plain loop
that benchmarks compare against (bench/python_loop/gpt_loop.py).

The model is examples/gpt/model's: GPT-2's architecture with its presets, tied head, dropout 0, the same attention
math, built and initialised in the same order from the same seed, with the same parameter names — so its weights are
gpt-train's, and a checkpoint of either loads into the other. The data is gpt-train's: bytes of its embedded default
corpus (the same files) or of --data, in sequential windows, the same rows per rank and micro-step.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# (n_layer, n_head, n_embd, block_size), as examples/gpt/model/gpt_config.cpp's kPresets.
PRESETS = {"tiny": (4, 4, 128, 128), "small": (6, 8, 256, 256), "gpt2": (12, 12, 768, 1024),
           "gpt2-medium": (24, 16, 1024, 1024), "gpt2-large": (36, 20, 1280, 1024), "gpt2-xl": (48, 25, 1600, 1024)}
# gpt-train's embedded default corpus (examples/gpt/CMakeLists.txt GPT_CORPUS_DIR / GPT_CORPUS_FILES).
CORPUS_DIR = "/usr/share/common-licenses"
CORPUS_FILES = ["GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "Artistic", "MPL-2.0", "GFDL-1.3"]
INIT_STD = 0.02  # GPT-2's initializer_range


def init_gpt2(module, n_layer):
    """GPT-2's initialisation, as gpt.cpp's init_gpt2: module and everything under it, in registration order. MoE
    experts are left to init_experts."""
    residual_std = INIT_STD / math.sqrt(2.0 * n_layer)
    with torch.no_grad():
        for name, m in module.named_modules():
            if "deepspeed_experts" in name:
                continue
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, residual_std if name.endswith("c_proj") else INIT_STD)
                if m.bias is not None:  # an MoE gate has none
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, INIT_STD)
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()


class Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v stacked along the output dim
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))  # 3 x (B, nh, T, hs)
        # torch's fused attention, as gpt.cpp's (examples/gpt/model/attention.cpp): flash attention on a GPU.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def init_experts(layer, n_embd, n_layer):
    """An MoE block's experts (and residual MLP): copies of one fresh MLP initialised as GPT-2's, as gpt.cpp's
    init_experts (DeepSpeed deep-copies the expert it is given)."""
    fresh = Mlp(n_embd)
    init_gpt2(fresh, n_layer)
    values = list(fresh.parameters())
    with torch.no_grad():
        targets = list(layer.deepspeed_moe.experts.deepspeed_experts) + ([layer.mlp] if layer.use_residual else [])
        for module in targets:
            for p, value in zip(module.parameters(), values):
                p.copy_(value)


class Block(nn.Module):
    """`moe`: dscpp.moe.layer.MoE's arguments for an MoE block (gpt-train's blocks 1, 3, …), None for a dense one."""

    def __init__(self, n_embd, n_head, moe=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        if moe is None:
            self.mlp = Mlp(n_embd)
        else:
            from dscpp.moe.layer import MoE  # the only dscpp in the model; a dense GPT is plain PyTorch
            self.mlp = MoE(hidden_size=n_embd, expert=Mlp(n_embd), **moe)
        self.is_moe = moe is not None
        self.l_aux = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        if not self.is_moe:
            return x + self.mlp(self.ln_2(x))
        out, self.l_aux, _ = self.mlp(self.ln_2(x))
        return x + out


class Gpt(nn.Module):
    """Modules built and initialised in gpt.cpp's order, so the random draws, and so the weights, are the same."""

    def __init__(self, vocab_size, n_layer, n_head, n_embd, block_size, moe=None, moe_loss_coeff=0.01):
        """`moe`: MoE's arguments (num_experts, ep_size, k, …) for blocks 1, 3, …, as gpt-train's --moe_* flags."""
        super().__init__()
        self.moe_loss_coeff = moe_loss_coeff
        self.wte = nn.Embedding(vocab_size, n_embd)  # (V, C), also the LM head
        init_gpt2(self.wte, n_layer)
        self.wpe = nn.Embedding(block_size, n_embd)
        init_gpt2(self.wpe, n_layer)
        self.h = nn.ModuleList()
        for i in range(n_layer):
            self.h.append(Block(n_embd, n_head, moe if i % 2 == 1 else None))
            init_gpt2(self.h[-1], n_layer)
            if self.h[-1].is_moe:
                init_experts(self.h[-1].mlp, n_embd, n_layer)
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        init_gpt2(self.ln_f, n_layer)

    def forward(self, idx, targets=None):  # (B, T) int64 -> mean next-token cross-entropy, in fp32
        """The loss; without `targets`, the logits (B, T, V) (a distillation's student and teacher)."""
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        aux = None  # the MoE blocks' load-balancing losses, summed in block order, as gpt.cpp's moe_aux_loss
        for block in self.h:
            if block.is_moe:
                aux = block.l_aux if aux is None else aux + block.l_aux
        return loss if aux is None else loss + aux * self.moe_loss_coeff


def load_tokens(path, seq_len):
    """Byte tokens of --data or of gpt-train's default corpus; random bytes if the corpus files are missing."""
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        files = [os.path.join(CORPUS_DIR, name) for name in CORPUS_FILES]
        if not all(os.path.exists(f) for f in files):
            print(f"[gpt_loop] {CORPUS_DIR} lacks gpt-train's corpus: training on random bytes", flush=True)
            return torch.randint(0, 256, (64 * (seq_len + 1),), generator=torch.Generator().manual_seed(0))
        data = b"".join(open(f, "rb").read() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def rows(tokens, seq_len, step, global_batch, row_begin, num_rows):
    """gpt::BatchSampler::rows in sequential order: sample i reads window i mod W of T + 1 tokens."""
    num_windows = (tokens.numel() - 1) // seq_len
    samples = torch.arange(num_rows) + step * global_batch + row_begin
    starts = (samples % num_windows) * seq_len
    windows = tokens[starts.unsqueeze(1) + torch.arange(seq_len + 1)]  # (rows, T + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
