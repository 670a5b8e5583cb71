"""Models for the Python front end's tests, in plain PyTorch: a small GPT-2-shaped decoder (tied embedding and head,
learned positions, pre-LayerNorm, causal attention), torchvision's resnet18 (BatchNorm buffers), and TiedModel (a
tied pair, BatchNorm, a non-persistent buffer)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGpt(nn.Module):
    """forward(tokens) → mean next-token loss, as a script's model(batch) returns it."""

    def __init__(self, vocab=64, width=32, heads=2, layers=2, seq=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.unused = nn.Parameter(torch.ones(3))  # never reaches the loss
        self.checkpoint = None  # e.g. dscpp.checkpointing.checkpoint: each block through it
        with torch.no_grad():  # GPT-2's scale, so the first losses are near ln(vocab)
            self.wte.weight.normal_(0.0, 0.02)
            self.wpe.weight.normal_(0.0, 0.02)

    def forward(self, tokens):
        x = self.wte(tokens[:, :-1]) + self.wpe(torch.arange(tokens.size(1) - 1, device=tokens.device))
        for block in self.blocks:
            x = block(x) if self.checkpoint is None else self.checkpoint(block, x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


class ResNetLoss(nn.Module):
    """torchvision's resnet18 with its loss: forward(images, labels) → mean cross-entropy."""

    def __init__(self, classes=10):
        super().__init__()
        import torchvision
        self.net = torchvision.models.resnet18(num_classes=classes)

    def forward(self, images, labels):
        return F.cross_entropy(self.net(images).float(), labels)


class Quirky(nn.Module):
    """What ZeRO-3's hooks must survive: a module called twice in one forward, a branch some steps skip, and a
    parameter the model's own forward reads outside its module (out.weight, through F.linear)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.shared = nn.Linear(16, 16)
        self.branch = nn.Linear(16, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x, y, use_branch):
        h = torch.tanh(self.shared(torch.tanh(self.shared(torch.tanh(self.inp(x))))))
        if bool(use_branch[0]):
            h = h + torch.tanh(self.branch(h))
        return F.mse_loss(F.linear(h, self.out.weight, self.out.bias), y)


def make_model(kind, seed=0):
    torch.manual_seed(seed)
    return {"gpt": TinyGpt, "resnet": ResNetLoss, "quirky": Quirky}[kind]()


def global_batches(kind, steps, global_batch, seed=1):
    """`steps` global batches: tuples of the forward's arguments, each sample-major."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt":
        return [(torch.randint(0, 64, (global_batch, 16), generator=g),) for _ in range(steps)]
    if kind == "quirky":  # the branch runs on even steps only
        return [(torch.randn(global_batch, 8, generator=g), torch.randn(global_batch, 1, generator=g),
                 torch.full((global_batch,), step % 2 == 0)) for step in range(steps)]
    return [(torch.randn(global_batch, 3, 64, 64, generator=g), torch.randint(0, 10, (global_batch,), generator=g))
            for _ in range(steps)]


def chunk(batch, index, size):
    """Micro-batch `index` of `size` samples from a global batch."""
    return tuple(t[index * size:(index + 1) * size] for t in batch)


class TiedModel(torch.nn.Module):
    """An embedding and a head sharing one weight (GPT-2's tie), and a persistent and a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, ids):
        return torch.nn.functional.cross_entropy(self.head(self.norm(self.embed(ids))), ids)
