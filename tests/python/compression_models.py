"""Small models and configs for the compression tests: a two-block transformer (embedding, q/k/v/o attention, fc1/fc2
MLP, head) and a convolution + batch norm stack."""
import torch
from torch import nn

VOCAB, DIM, HEADS, HIDDEN = 40, 16, 4, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(layer):  # a head's width stays: head pruning that removes heads leaves fewer of them
            return layer(x).view(b, t, -1, DIM // HEADS).transpose(1, 2)

        q, k, v = heads(self.q), heads(self.k), heads(self.v)
        attention = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        x = x + self.o(attention.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(torch.relu(self.fc1(x)))


class TinyLM(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids, targets=None):
        """The logits, or with `targets` the next-token loss."""
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        if targets is None:
            return logits
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.conv2 = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3)

    def forward(self, x):
        return self.conv2(torch.relu(self.bn1(self.conv1(x))))


def group(modules, related=None, **params):
    g = {"params": params, "modules": modules}
    if related is not None:
        g["related_modules"] = related
    return g


def technique(groups, **shared):
    return {"shared_parameters": {"enabled": True, **shared}, "different_groups": groups}


def every_technique(offset=0, in_forward=True, weight_bits=8):
    """Weight quantization of the attention's layers, sparse pruning of the MLP's fc2, row pruning of fc1 (fc2's
    input columns following), head pruning of o (q/k/v's rows following), activation quantization of the head — all
    from step `offset`."""
    return {
        "weight_quantization": technique(
            {"wq1": group([r"blocks\.\d\.[qkvo]$"], start_bits=weight_bits, target_bits=weight_bits)},
            quantize_weight_in_forward=in_forward, schedule_offset=offset, quantize_groups=2),
        "sparse_pruning": technique({"sp1": group([r"fc2"], dense_ratio=0.5)}, schedule_offset=offset),
        "row_pruning": technique({"rp1": group([r"fc1"], related=[[r"fc2"]], dense_ratio=0.75)},
                                 schedule_offset=offset),
        "head_pruning": technique({"hp1": group([r"\.o$"], related=[[r"\.q$", r"\.k$", r"\.v$"]], dense_ratio=0.5)},
                                  schedule_offset=offset, num_heads=HEADS),
        "activation_quantization": technique({"aq1": group(["head"], bits=8)}, schedule_offset=offset),
    }


def ds_config(compression, stage=0, micro=4, gas=1, dtype=None, lr=1e-2):
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "Adam", "params": {"lr": lr}}, "zero_optimization": {"stage": stage},
              "gradient_clipping": 0.0, "compression_training": compression}
    if dtype:
        config[dtype] = {"enabled": True}
    return config


def batch(seed, size):
    """(inputs, next-token targets) of `size` sequences."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (size, 9), generator=g)
    return ids[:, :-1], ids[:, 1:]
