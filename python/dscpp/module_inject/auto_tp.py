"""dscpp.module_inject.auto_tp: automatic tensor parallelism for inference (DeepSpeed's AutoTP) — a model's own
linear layers sliced over a tensor-parallel group by their role, found from the module structure.

What is sliced, and how (`plan` finds it; `apply` does it):
  - The transformer blocks are the children of the model's nn.ModuleLists (as DeepSpeed's get_module_list finds
    them). Inside a block every linear (nn.Linear, or HF's Conv1D) is one of:
      row-parallel (LinearAllreduce): the projections back to the hidden size, whose outputs are all-reduced — by
        name (o_proj, out_proj, down_proj, c_proj, dense_4h_to_h, fc2, w2, wo, attention.dense) or, as DeepSpeed's
        parser also decides, the last linear before a norm layer; or the names an injection_policy gives for the
        block's class ({LlamaDecoderLayer: ("self_attn.o_proj", "mlp.down_proj")}), which then are the only ones;
      column-parallel (LinearLayer): every other one (q, k, v, up, gate, fc1), its output left split by heads or
        hidden units for the row-parallel layer after it. A fused projection is split per part, so each rank keeps
        its heads of q, of k and of v (GPT-2's c_attn in thirds; qkv_proj by its config's head counts) or its share
        of gate and of up (gate_up_proj); other fused layouts (W_pack, Wqkv, query_key_value) are refused.
    Only nn.Linear and Conv1D themselves are sliced; a subclass (a quantized linear) is an error naming it. With an
    injection_policy only the block classes it names are sliced.
    A module owning a column-parallel linear has its head and width counts (num_heads, num_key_value_heads,
    split_size, embed_dim, …) divided by the size, as DeepSpeed's update_mp_params does, so its forward reshapes
    its share of the heads.
  - The vocabulary: the input embedding (model.get_input_embeddings(), else an nn.Embedding named embed_tokens, wte
    or word_embeddings) and the output head (lm_head, embed_out, or a linear with as many outputs as the embedding
    has rows) are split over the vocabulary when it divides by the size — the head's logits all-gathered, so
    generate sees them whole; a tied pair stays tied. Otherwise — or when the embedding is a subclass with a forward
    of its own (Gemma's scaled one) — both stay whole on every rank.
  - Anything else (norms, position embeddings, linears outside the blocks) stays whole.
Sizes that do not divide (heads, widths) are errors naming the layer and the numbers."""
import torch

from .layers import LinearAllreduce, LinearLayer, VocabParallelEmbedding, is_conv1d, linear_weight

ROW_NAMES = ("o_proj", "out_proj", "down_proj", "c_proj", "dense_4h_to_h", "fc2", "w2", "wo")
ROW_SUFFIXES = ("attention.dense", "attention.output.dense", "output.dense")
FUSED_NAMES = ("c_attn", "qkv_proj", "gate_up_proj")  # fused projections whose layout is known (_parts)
UNKNOWN_FUSED_NAMES = ("W_pack", "Wqkv", "query_key_value")  # fused per model in ways AutoTP here does not know
NORM_NAMES = ("LayerNorm", "layer_norm", "ln_1", "ln_2", "ln_f", "norm")
HEAD_NAMES = ("lm_head", "embed_out")
EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings")
# Counts a module keeps of its heads or width, divided by the size where it owns a column-parallel linear.
SHARDED_ATTRIBUTES = ("num_heads", "n_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads",
                      "all_head_size", "embed_dim", "split_size", "inner_dim")


def is_linear(module):
    """A linear AutoTP may see: nn.Linear or HF's Conv1D, or a subclass (checked by _check_slicable)."""
    return isinstance(module, torch.nn.Linear) or is_conv1d(module)


def _check_slicable(name, module):
    """Only nn.Linear and Conv1D themselves are sliced: a subclass (a quantized linear, an adapter wrapper) has a
    forward of its own that the sliced layer would drop."""
    if type(module) is not torch.nn.Linear and not is_conv1d(module):
        raise ValueError(f"AutoTP: {name} is a {type(module).__name__}, a subclass of nn.Linear with a forward of its "
                         "own, which slicing would drop; AutoTP slices nn.Linear and Conv1D layers only")


def _is_norm(name, module):
    kind = type(module).__name__
    return (isinstance(module, torch.nn.LayerNorm) or kind.endswith("LayerNorm") or kind.endswith("RMSNorm")
            or name.rsplit(".", 1)[-1] in NORM_NAMES)


def blocks(model):
    """[(name, block)]: the children of every nn.ModuleList, in module order."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            found += [(f"{name}.{child_name}" if name else child_name, child)
                      for child_name, child in module.named_children()]
    return found


def _row_linears(block, policy):
    """The names (relative to the block) of its row-parallel linears."""
    names = policy.get(type(block)) if policy else None
    if names is not None:
        return set(names)
    rows, previous = set(), None
    for name, module in block.named_modules():
        if is_linear(module):
            last = name.rsplit(".", 1)[-1]
            if last in ROW_NAMES or any(name == s or name.endswith("." + s) for s in ROW_SUFFIXES):
                rows.add(name)
            previous = name
        elif name and _is_norm(name, module) and not list(module.children()):
            if previous is not None:
                rows.add(previous)  # the last linear before a norm (DeepSpeed's parser's rule)
            previous = None
    return rows


class Plan:
    """What AutoTP slices: {qualified name: "row" | "column" | "fused"} for the blocks' linears, and the
    vocabulary pair (embedding name, head name; None where there is none or the vocabulary stays whole)."""

    def __init__(self):
        self.linears = {}
        self.embedding = None
        self.head = None


def plan(model, size, injection_policy=None):
    """The Plan for `model` over `size` ranks. ValueError when no block is found, or an injection_policy names a
    linear its block does not have."""
    result = Plan()
    found = blocks(model)
    if not found:
        raise ValueError(f"AutoTP: {type(model).__name__} has no nn.ModuleList of blocks, so no transformer layers "
                         "were found to slice; give injection_policy={BlockClass: (names of its row-parallel "
                         "linears)} for a model whose blocks are in one")
    if injection_policy:
        missing = [c.__name__ for c in injection_policy if not any(type(b) is c for _, b in found)]
        if missing:
            raise ValueError(f"AutoTP: injection_policy names {missing}, which is no block of this model (its "
                             f"blocks: {sorted({type(b).__name__ for _, b in found})})")
        found = [(n, b) for n, b in found if type(b) in injection_policy]  # only the named classes are sliced
    for block_name, block in found:
        rows = _row_linears(block, injection_policy)
        linears = {name for name, m in block.named_modules() if is_linear(m)}
        missing = rows - linears
        if missing:
            raise ValueError(f"AutoTP: injection_policy names {sorted(missing)} for {type(block).__name__}, which "
                             f"has no such linear (its linears: {sorted(linears)})")
        for name in sorted(linears):
            last = name.rsplit(".", 1)[-1]
            if last in UNKNOWN_FUSED_NAMES:
                raise ValueError(f"AutoTP: {block_name}.{name} is a fused projection ({last}) whose layout differs "
                                 "by model; AutoTP here slices c_attn, qkv_proj and gate_up_proj fused layers only")
            role = "row" if name in rows else ("fused" if last in FUSED_NAMES else "column")
            result.linears[f"{block_name}.{name}"] = role
    result.embedding, result.head = _vocabulary(model, size)
    return result


def _vocabulary(model, size):
    modules = dict(model.named_modules())
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    embedding_name = next((n for n, m in modules.items() if embedding is not None and m is embedding), None)
    if embedding_name is None:
        embedding_name = next((n for n, m in modules.items()
                               if isinstance(m, torch.nn.Embedding) and n.rsplit(".", 1)[-1] in EMBEDDING_NAMES), None)
    # Only nn.Embedding itself is split: a subclass (Gemma's scaled embedding) has a forward of its own.
    if embedding_name is None or type(modules[embedding_name]) is not torch.nn.Embedding:
        return None, None
    vocab = modules[embedding_name].num_embeddings
    head_name = next((n for n, m in modules.items() if is_linear(m) and n.rsplit(".", 1)[-1] in HEAD_NAMES), None)
    if head_name is None:
        head_name = next((n for n, m in modules.items() if isinstance(m, torch.nn.Linear) and m.out_features == vocab
                          and not any(n.startswith(b + ".") for b, _ in blocks(model))), None)
    if head_name is not None and type(modules[head_name]) is not torch.nn.Linear and not is_conv1d(modules[head_name]):
        head_name = None  # a head of its own kind stays whole (the logits then come out whole on every rank)
    if vocab % size != 0:
        return None, None  # the vocabulary stays whole on every rank
    return embedding_name, head_name


def _set(model, name, module):
    parent, _, last = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, last, module)


def _head_dim(owner):
    head_dim = getattr(owner, "head_dim", None)
    return head_dim if isinstance(head_dim, int) and not isinstance(head_dim, bool) else None


def _parts(name, module, owner):
    """The row counts of a fused projection's parts, in order (its output rows split into them), or None for a plain
    column-parallel linear: c_attn q|k|v in equal thirds (GPT-2), gate_up_proj gate|up in halves, qkv_proj q|k|v by
    the owner's head counts (grouped-query attention makes k and v smaller than q)."""
    rows = linear_weight(module).shape[0]
    last = name.rsplit(".", 1)[-1]
    if last == "gate_up_proj":
        return [rows // 2, rows - rows // 2]
    config = getattr(owner, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if last == "qkv_proj" and heads and _head_dim(owner):
        q, kv = heads * _head_dim(owner), kv_heads * _head_dim(owner)
        if q + 2 * kv != rows:
            raise ValueError(f"AutoTP: {name} has {rows} output rows, not q {q} + k {kv} + v {kv} from its "
                             f"config's {heads} heads and {kv_heads} key/value heads of {_head_dim(owner)}")
        return [q, kv, kv]
    return [rows // 3] * 3


def _check_divides(name, module, role, size, owner):
    """Each part a rank's slice is cut from must divide over the size — in whole heads where the owner says how
    large a head is (its head_dim)."""
    _check_slicable(name, module)
    weight = linear_weight(module)
    if role == "row":
        parts, what, unit = [weight.shape[1]], "in_features", 1
    else:
        parts = _parts(name, module, owner) if role == "fused" else [weight.shape[0]]
        what = "out_features" + (f" (fused parts {parts})" if role == "fused" else "")
        unit = 1 if name.endswith("gate_up_proj") else (_head_dim(owner) or 1)
    if any(part % (size * unit) != 0 for part in parts) or sum(parts) != weight.shape[1 if role == "row" else 0]:
        raise ValueError(f"AutoTP: {name} has {what} {weight.shape[1 if role == 'row' else 0]}, which does not divide "
                         f"over tensor_parallel.tp_size {size}" + (f" in whole heads of {unit}" if unit > 1 else ""))


def apply(model, the_plan, comm):
    """Slices `model` in place by `the_plan` over `comm` (a dscpp._C.Comm of the tensor-parallel group). Every size
    is checked first, so a model that cannot be sliced is left as it was."""
    size = comm.world_size
    modules = dict(model.named_modules())
    owner_of = {name: modules[name.rpartition(".")[0]] for name in the_plan.linears}
    owners = {name.rpartition(".")[0] for name, role in the_plan.linears.items() if role != "row"}
    for name, role in the_plan.linears.items():
        _check_divides(name, modules[name], role, size, owner_of[name])
    for parent in owners:
        _divide_counts(modules[parent], size, parent, check_only=True)
    if the_plan.embedding is not None and modules[the_plan.embedding].max_norm is not None:
        raise ValueError(f"AutoTP: {the_plan.embedding} renormalises rows (max_norm "
                         f"{modules[the_plan.embedding].max_norm}), which a vocabulary-parallel embedding cannot do")
    for name, role in the_plan.linears.items():
        module = modules[name]
        if role == "row":
            _set(model, name, LinearAllreduce.sliced(module, comm))
        else:
            parts = _parts(name, module, owner_of[name]) if role == "fused" else None
            _set(model, name, LinearLayer.sliced(module, comm, parts=parts))
    for parent in owners:
        _divide_counts(modules[parent], size, parent)
    _apply_vocabulary(model, modules, the_plan, comm)


def _divide_counts(module, size, name, check_only=False):
    for attribute in SHARDED_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            if value % size != 0:
                raise ValueError(f"AutoTP: {name}.{attribute} is {value}, which does not divide over "
                                 f"tensor_parallel.tp_size {size}")
            if not check_only:
                setattr(module, attribute, value // size)


def _apply_vocabulary(model, modules, the_plan, comm):
    if the_plan.embedding is None:
        return
    embedding = modules[the_plan.embedding]
    sliced = VocabParallelEmbedding.sliced(embedding, comm)
    _set(model, the_plan.embedding, sliced)
    if the_plan.head is None:
        return
    head = modules[the_plan.head]
    tied = head.weight is embedding.weight
    new_head = LinearLayer.sliced(head, comm, gather_output=True)
    if tied:
        new_head.weight = sliced.weight  # one slice, as the whole model had one table
    _set(model, the_plan.head, new_head)
