"""dscpp.module_inject.layers: the tensor-parallel layers AutoTP puts in place of a model's own (DeepSpeed's
deepspeed.module_inject.layers). Each holds this rank's slice of the layer it replaces, under the same parameter
names (weight, bias), and computes through the C++ engine's sliced-layer forwards (dscpp/parallel/
tensor_parallel_layers.h, bound in python/src/parallel.cpp), so the collectives are the engine's Comm's.

    LinearLayer            column-parallel: weight rows [r·out/p, (r+1)·out/p); the output stays split (for the
                           LinearAllreduce after it), or is all-gathered (gather_output: a vocabulary head).
    LinearAllreduce        row-parallel: weight columns [r·in/p, (r+1)·in/p) of a split input; the partial
                           products all-reduced, the whole bias added once.
    VocabParallelEmbedding rows [r·V/p, (r+1)·V/p) of the table; the all-reduce fills in the other ranks' tokens.

Built from a whole layer by `sliced` helpers below; an HF Conv1D (weight stored (in, out)) is taken in Linear's
(out, in) layout, as its forward x·W + b is x·(Wᵀ)ᵀ + b."""
import torch

from .. import _C


def linear_weight(module):
    """The (out, in) weight of an nn.Linear, or of an HF Conv1D (stored transposed)."""
    return module.weight.t() if is_conv1d(module) else module.weight


def is_conv1d(module):
    """HF transformers' Conv1D (GPT-2's linears), recognised without importing transformers."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _own(t):
    """A parameter of its own (no grad: inference) that holds a slice without keeping the whole tensor alive."""
    return torch.nn.Parameter(t.detach().contiguous().clone(), requires_grad=False)


def _rows(t, rank, size, parts):
    """Rank's rows of `t`: split along dim 0 into blocks of `parts` rows (None: one block), each split over `size`
    ranks — for a fused q|k|v projection rank r takes its heads of q, of k and of v."""
    blocks = t.split(parts, dim=0) if parts else [t]
    return torch.cat([block.chunk(size, dim=0)[rank] for block in blocks], dim=0)


class LinearLayer(torch.nn.Module):
    def __init__(self, weight, bias, comm, gather_output=False):
        super().__init__()
        self.weight = _own(weight)
        self.bias = None if bias is None else _own(bias)
        self.comm = comm
        self.gather_output = gather_output

    @classmethod
    def sliced(cls, module, comm, parts=None, gather_output=False):
        """`module`'s (nn.Linear or Conv1D) output rows for this rank; `parts`: a fused projection's row counts."""
        rank, size = comm.rank, comm.world_size
        weight = _rows(linear_weight(module), rank, size, parts)
        bias = None if module.bias is None else _rows(module.bias, rank, size, parts)
        return cls(weight, bias, comm, gather_output)

    def forward(self, x):
        y = _C.column_parallel_linear(x, self.weight, self.bias, self.comm)
        return _C.gather_from_model_parallel(y, self.comm) if self.gather_output else y

    def extra_repr(self):
        return (f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]} (rank {self.comm.rank} "
                f"of {self.comm.world_size}), gather_output={self.gather_output}")


class LinearAllreduce(torch.nn.Module):
    def __init__(self, weight, bias, comm):
        super().__init__()
        self.weight = _own(weight)
        self.bias = None if bias is None else _own(bias)
        self.comm = comm

    @classmethod
    def sliced(cls, module, comm):
        """`module`'s input columns for this rank; the bias whole."""
        weight = linear_weight(module).chunk(comm.world_size, dim=1)[comm.rank]
        return cls(weight, module.bias, comm)

    def forward(self, x):
        return _C.row_parallel_linear(x, self.weight, self.bias, self.comm)

    def extra_repr(self):
        return (f"in_features={self.weight.shape[1]} (rank {self.comm.rank} of {self.comm.world_size}), "
                f"out_features={self.weight.shape[0]}")


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, weight, vocab_begin, comm):
        super().__init__()
        self.weight = weight if isinstance(weight, torch.nn.Parameter) else _own(weight)
        self.vocab_begin = vocab_begin
        self.comm = comm

    @classmethod
    def sliced(cls, embedding, comm):
        rows = embedding.num_embeddings // comm.world_size
        return cls(embedding.weight[comm.rank * rows:(comm.rank + 1) * rows], comm.rank * rows, comm)

    def forward(self, ids):
        return _C.vocab_parallel_embedding(ids, self.weight, self.vocab_begin, self.comm)

    def extra_repr(self):
        return (f"rows {self.vocab_begin}..{self.vocab_begin + self.weight.shape[0]} of the vocabulary (rank "
                f"{self.comm.rank} of {self.comm.world_size}), embedding_dim={self.weight.shape[1]}")
