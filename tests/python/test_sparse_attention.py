"""Block-sparse attention (issue 53): the layouts against DeepSpeed's rules written out here in plain Python (the
random blocks from Python's `random`, as DeepSpeed draws them), the C++ port of Python's random against Python's own,
SparseSelfAttention against dense attention under the layout (outputs and gradients, each mask mode),
BertSparseSelfAttention and SparseAttentionUtils, the config section, and the engine refusing a section no module
applies."""
import json
import random

import pytest
import torch

import dscpp
from dscpp import _C
from dscpp.ops.sparse_attention import (BertSparseSelfAttention, BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                        DenseSparsityConfig, FixedSparsityConfig, LocalSlidingWindowSparsityConfig,
                                        SparseAttentionUtils, SparseSelfAttention, SparsityConfig,
                                        VariableSparsityConfig, sparsity_config_from_dict)

# ---- DeepSpeed's layout rules (deepspeed/ops/sparse_attention/sparsity_config.py), written out -------------------


def ref_fixed(H, nb, block, per_head, nl, ng, uni, horizontal, patterns):
    L = torch.zeros(H, nb, nb, dtype=torch.int64)
    for h in range(H if per_head else 1):
        for w in range(0, nb, nl):  # local windows
            for row in range(w, min(w + nl, nb)):
                L[h, row, w:(row + 1 if uni else min(w + nl, nb))] = 1
        first = nl - (1 + h % patterns) * ng
        full_end = nb - nb % nl
        starts = list(range(first, full_end, nl))
        if full_end < nb:
            starts.append(min(full_end + first, nb - ng))
        for s in starts:
            L[h, (s if uni else 0):, s:s + ng] = 1
            if horizontal:
                L[h, s:s + ng, :] = 1
    if not per_head:
        L[1:] = L[0]
    return L


def ref_variable(H, nb, per_head, nrand, windows, gstart, gend, uni, horizontal):
    L = torch.zeros(H, nb, nb, dtype=torch.int64)
    for h in range(H if per_head else 1):
        for row in range(nb):
            L[h, row, random.sample(range(nb), nrand)] = 1
        begin, end = 0, 0
        for size in windows:
            end = min(end + size, nb)
            for row in range(begin, end):
                L[h, row, begin:(row + 1 if uni else end)] = 1
            begin += size
        for w in range(begin, nb, windows[-1]):
            for row in range(w, min(w + windows[-1], nb)):
                L[h, row, w:(row + 1 if uni else min(w + windows[-1], nb))] = 1
        for i, s in enumerate(gstart):
            if s < nb:
                e = min(gend[i], nb) if gend else s + 1
                if horizontal:
                    L[h, s:e, :] = 1
                L[h, (s if uni else 0):, s:e] = 1
    if not per_head:
        L[1:] = L[0]
    return L


def ref_window(L, h, nb, window):
    """BigBird's and Longformer's sliding window: window // 2 blocks either side of the diagonal."""
    for row in range(nb):
        L[h, row, max(0, row - window // 2):min(row + window // 2 + 1, nb)] = 1


def ref_bigbird(H, nb, per_head, nrand, window, ng, uni):
    L = torch.zeros(H, nb, nb, dtype=torch.int64)
    for h in range(H if per_head else 1):
        for row in range(nb):
            L[h, row, random.sample(range(nb if not uni else row + 1), nrand)] = 1
        ref_window(L, h, nb, window)
        L[h, :ng, :] = 1
        L[h, :, :ng] = 1
        if uni:
            L = torch.tril(L)
    if not per_head:
        L[1:] = L[0]
    return L


def ref_bslongformer(H, nb, per_head, window, gstart, gend, uni):
    L = torch.zeros(H, nb, nb, dtype=torch.int64)
    for h in range(H if per_head else 1):
        ref_window(L, h, nb, window)
        for i, s in enumerate(gstart):
            if s < nb:
                e = min(gend[i], nb) if gend else s + 1
                L[h, s:e, :] = 1
                L[h, :, s:e] = 1
        if uni:
            L = torch.tril(L)
    if not per_head:
        L[1:] = L[0]
    return L


def ref_local(H, nb, window, uni):
    L = torch.zeros(H, nb, nb, dtype=torch.int64)
    for row in range(nb):
        L[0, row, max(0, row - window // 2):(row + 1 if uni else min(row + window // 2 + 1, nb))] = 1
    L[1:] = L[0]
    return L


H, BLOCK = 4, 16

CASES = [
    ("dense", lambda: DenseSparsityConfig(H, BLOCK), lambda nb: torch.ones(H, nb, nb, dtype=torch.int64)),
    ("fixed", lambda: FixedSparsityConfig(H, BLOCK), lambda nb: ref_fixed(H, nb, BLOCK, False, 4, 1, False, False, 1)),
    ("fixed-uni", lambda: FixedSparsityConfig(H, BLOCK, num_local_blocks=3, attention="unidirectional"),
     lambda nb: ref_fixed(H, nb, BLOCK, False, 3, 1, True, False, 1)),
    ("fixed-patterns", lambda: FixedSparsityConfig(H, BLOCK, True, num_local_blocks=4, num_global_blocks=2,
                                                   horizontal_global_attention=True, num_different_global_patterns=2),
     lambda nb: ref_fixed(H, nb, BLOCK, True, 4, 2, False, True, 2)),
    ("variable", lambda: VariableSparsityConfig(H, BLOCK, num_random_blocks=2, local_window_blocks=[1, 2, 3],
                                                global_block_indices=[0, 4], horizontal_global_attention=True),
     lambda nb: ref_variable(H, nb, False, 2, [1, 2, 3], [0, 4], None, False, True)),
    ("variable-ranges", lambda: VariableSparsityConfig(H, BLOCK, True, num_random_blocks=1, local_window_blocks=[2],
                                                       global_block_indices=[1, 6], global_block_end_indices=[3, 9],
                                                       attention="unidirectional"),
     lambda nb: ref_variable(H, nb, True, 1, [2], [1, 6], [3, 9], True, False)),
    ("bigbird", lambda: BigBirdSparsityConfig(H, BLOCK, True, num_random_blocks=2, num_global_blocks=2),
     lambda nb: ref_bigbird(H, nb, True, 2, 3, 2, False)),
    ("bigbird-uni", lambda: BigBirdSparsityConfig(H, BLOCK, num_random_blocks=1, num_sliding_window_blocks=5,
                                                  attention="unidirectional"),
     lambda nb: ref_bigbird(H, nb, False, 1, 5, 1, True)),
    ("bslongformer", lambda: BSLongformerSparsityConfig(H, BLOCK, num_sliding_window_blocks=5,
                                                        global_block_indices=[0, 7], global_block_end_indices=[2, 8]),
     lambda nb: ref_bslongformer(H, nb, False, 5, [0, 7], [2, 8], False)),
    ("bslongformer-uni", lambda: BSLongformerSparsityConfig(H, BLOCK, True, attention="unidirectional"),
     lambda nb: ref_bslongformer(H, nb, True, 3, [0], None, True)),
    ("local", lambda: LocalSlidingWindowSparsityConfig(H, BLOCK, num_sliding_window_blocks=4),
     lambda nb: ref_local(H, nb, 4, True)),
]


@pytest.mark.parametrize("name,make,reference", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seq_len", [16 * 13, 16 * 40])
def test_layouts_are_deepspeeds(name, make, reference, seq_len):
    config = make()
    random.seed(7)
    ours = config.make_layout(seq_len)
    after_ours = random.random()
    random.seed(7)
    want = reference(seq_len // BLOCK)
    after_want = random.random()
    assert ours.dtype == torch.int64 and torch.equal(ours, want), name
    assert after_ours == after_want  # the same draws, so the next layout built in a script is DeepSpeed's too


@pytest.mark.parametrize("uni", [False, True])
def test_fewer_blocks_than_a_fixed_windows_globals_wrap_as_deepspeeds_slices(uni):
    """2 blocks, windows of 4 with 4 global blocks: DeepSpeed's start index goes negative and Python's slices wrap."""
    attention = "unidirectional" if uni else "bidirectional"
    ours = FixedSparsityConfig(H, BLOCK, num_local_blocks=4, num_global_blocks=4, attention=attention,
                               horizontal_global_attention=not uni).make_layout(2 * BLOCK)
    assert torch.equal(ours, ref_fixed(H, 2, BLOCK, False, 4, 4, uni, not uni, 1))


def test_a_local_layout_is_one_sided_unless_bidirectional():
    """DeepSpeed's LocalSlidingWindowSparsityConfig tests attention == "bidirectional" (any other value: one-sided)."""
    layout = LocalSlidingWindowSparsityConfig(H, BLOCK, attention="causal").make_layout(8 * BLOCK)
    assert torch.equal(layout, ref_local(H, 8, 3, True))


@pytest.mark.parametrize("seed", [0, 1, 1234, 2**32 + 5, 2**63 - 1])
def test_the_cpp_random_is_pythons(seed):
    ours = _C.sparse_attention.PythonRandom(seed)
    random.seed(seed)
    for n, k in [(5, 2), (1, 1), (30, 4), (1000, 3), (70, 20), (17, 0), (37, 9), (38, 9)]:
        assert ours.sample(n, k) == random.sample(range(n), k), (n, k)
    assert [ours.getrandbits(b) for b in (1, 7, 31, 32, 0)] == [random.getrandbits(b) for b in (1, 7, 31, 32, 0)]


@pytest.mark.parametrize("make,message", [
    (lambda: FixedSparsityConfig(4, num_local_blocks=4, num_global_blocks=3), "must be divisible by"),
    (lambda: FixedSparsityConfig(4, num_different_global_patterns=2), "different_layout_per_head"),
    (lambda: FixedSparsityConfig(4, 16, True, num_local_blocks=4, num_global_blocks=2, num_different_global_patterns=3),
     "cannot exceed"),
    (lambda: VariableSparsityConfig(4, global_block_indices=[0, 3], global_block_end_indices=[2]), "as many"),
    (lambda: VariableSparsityConfig(4, global_block_indices=[3], global_block_end_indices=[3]), "smaller than"),
    (lambda: BSLongformerSparsityConfig(4, global_block_indices=[5], global_block_end_indices=[2]), "smaller than"),
])
def test_bad_configs_are_refused_as_deepspeed_refuses_them(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_attention_and_sizes():
    with pytest.raises(NotImplementedError, match="uni/bi-directional"):
        FixedSparsityConfig(4, attention="sideways")
    with pytest.raises(ValueError, match="horizontal global attention"):
        VariableSparsityConfig(4, attention="unidirectional", horizontal_global_attention=True)
    with pytest.raises(ValueError, match="needs to be dividable by Block size 16"):
        FixedSparsityConfig(4).make_layout(40)
    with pytest.raises(ValueError, match="num_sliding_window_blocks 5 must not exceed the 2 blocks"):
        BigBirdSparsityConfig(4, num_sliding_window_blocks=5).make_layout(32)
    with pytest.raises(NotImplementedError, match="abstract"):
        SparsityConfig(4).make_layout(32)


# ---- the attention ---------------------------------------------------------------------------------------------------


def dense_reference(q, k, v, layout, block, rpe=None, kpm=None, kpm_mul=False, am=None, am_mul=True):
    """softmax(QKᵀ/√d + rpe + masks) with everything outside the layout at -inf, then ·V."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if rpe is not None:
        scores = scores + rpe
    inf = float("inf")
    if kpm is not None:
        scores = scores + (torch.where(kpm == 0, -inf, 0.0) if kpm_mul else kpm)[:, None, None, :]
    if am is not None:
        scores = scores + (torch.where(am == 0, -inf, 0.0) if am_mul else am)
    keep = layout.repeat_interleave(block, 1).repeat_interleave(block, 2).bool()
    return torch.softmax(scores.masked_fill(~keep, -inf), -1) @ v


@pytest.mark.parametrize("kp_mode,attn_mode", [("add", "mul"), ("mul", "add")])
def test_sparse_self_attention_is_dense_attention_under_the_layout(kp_mode, attn_mode):
    torch.manual_seed(0)
    random.seed(3)
    config = BigBirdSparsityConfig(H, block=8, num_random_blocks=2, different_layout_per_head=True)
    attention = SparseSelfAttention(config, key_padding_mask_mode=kp_mode, attn_mask_mode=attn_mode,
                                    max_seq_length=128)
    B, T, D = 2, 64, 16
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rpe = torch.randn(H, T, T, dtype=torch.float64, requires_grad=True)
    kpm = torch.ones(B, T, dtype=torch.float64) if kp_mode == "mul" else torch.zeros(B, T, dtype=torch.float64)
    kpm[1, -9:] = 0 if kp_mode == "mul" else -1e4
    am = torch.ones(T, T, dtype=torch.float64).tril() if attn_mode == "mul" else torch.randn(T, T, dtype=torch.float64)
    layout = attention.master_layout[:, :T // 8, :T // 8]
    up = torch.randn(B, H, T, D, dtype=torch.float64)
    out = attention(q, k.transpose(-1, -2), v, rpe=rpe, key_padding_mask=kpm[:, None, None, :], attn_mask=am)
    grads = torch.autograd.grad((out * up).sum(), (q, k, v, rpe))
    want = dense_reference(q, k, v, layout, 8, rpe, kpm, kp_mode == "mul", am, attn_mode == "mul")
    want_grads = torch.autograd.grad((want * up).sum(), (q, k, v, rpe))
    assert (out - want).abs().max() < 1e-10
    for g, w in zip(grads, want_grads):
        assert (g - w).abs().max() < 1e-10
    # float32 and bfloat16 inputs compute the same (scores and softmax in fp32)
    out32 = attention(q.float(), k.float(), v.float(), key_padding_mask=kpm.float(), attn_mask=am.float())
    want32 = dense_reference(q, k, v, layout, 8, None, kpm, kp_mode == "mul", am, attn_mode == "mul")
    assert (out32.double() - want32).abs().max() < 1e-5
    out16 = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), key_padding_mask=kpm, attn_mask=am)
    assert out16.dtype == torch.bfloat16 and (out16.double() - want32).abs().max() < 5e-2


def test_a_shorter_sequence_uses_the_layouts_corner_and_errors_name_sizes():
    attention = SparseSelfAttention(FixedSparsityConfig(2, block=4), max_seq_length=32)
    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    want = dense_reference(q, q, q, attention.master_layout[:, :4, :4], 4)
    assert (attention(q, q, q) - want).abs().max() < 1e-10
    with pytest.raises(ValueError, match="longer than max_seq_length 32"):
        attention(*(torch.randn(1, 2, 48, 8),) * 3)
    with pytest.raises(ValueError, match="needs to be dividable by Block size 4"):
        attention(*(torch.randn(1, 2, 18, 8),) * 3)
    with pytest.raises(ValueError, match="the sparsity config has 2 heads, the query 3"):
        attention(*(torch.randn(1, 3, 16, 8),) * 3)
    # a layout written in place (a loaded checkpoint, rank 0's broadcast) is the one used next; copies work
    import copy
    twin = copy.deepcopy(attention)
    assert (twin(q, q, q) - want).abs().max() < 1e-10
    attention.master_layout.copy_(FixedSparsityConfig(2, block=4, num_local_blocks=2).make_layout(32))
    other = dense_reference(q, q, q, attention.master_layout[:, :4, :4], 4)
    assert (attention(q, q, q) - other).abs().max() < 1e-10 and (other - want).abs().max() > 1e-3
    with pytest.raises(ValueError, match="key_padding_mask_mode must be 'add' or 'mul'"):
        SparseSelfAttention(FixedSparsityConfig(2), key_padding_mask_mode="max")


class _BertConfig:
    hidden_size, num_attention_heads, max_position_embeddings = 32, 4, 64


def test_bert_sparse_self_attention_and_the_utils():
    torch.manual_seed(1)
    layer = BertSparseSelfAttention(_BertConfig(), FixedSparsityConfig(4, block=4, num_local_blocks=2))
    x = torch.randn(2, 16, 32)
    mask = torch.zeros(2, 1, 1, 16)
    mask[0, ..., -3:] = -10000.0
    q, k, v = (layer.transpose_for_scores(f(x)) for f in (layer.query, layer.key, layer.value))
    want = dense_reference(q, k, v, layer.sparse_self_attention.master_layout[:, :4, :4], 4, kpm=mask[:, 0, 0])
    assert (layer(x, mask) - want.permute(0, 2, 1, 3).reshape(2, 16, 32)).abs().max() < 1e-5
    # padding to the block size, and back
    ids = torch.arange(10).view(1, 10)
    pad, ids2, att, types, pos, emb = SparseAttentionUtils.pad_to_block_size(
        4, ids, torch.ones(1, 10), torch.zeros(1, 10, dtype=torch.long), None, None, pad_token_id=0,
        model_embeddings=None)
    assert pad == 2 and ids2.shape == (1, 12) and att[0, -2:].tolist() == [0, 0] and types.shape == (1, 12)
    assert SparseAttentionUtils.unpad_sequence_output(pad, torch.zeros(1, 12, 3)).shape == (1, 10, 3)
    # a BERT-shaped model's self-attention replaced, its projections kept
    model = torch.nn.Module()
    model.config = _BertConfig()
    model.bert = torch.nn.Module()
    model.bert.embeddings = torch.nn.Module()
    model.bert.embeddings.position_embeddings = torch.nn.Embedding(64, 32)
    model.bert.encoder = torch.nn.Module()
    model.bert.encoder.layer = torch.nn.ModuleList()
    for _ in range(2):
        block = torch.nn.Module()
        block.attention = torch.nn.Module()
        block.attention.self = torch.nn.Module()
        for name in ("query", "key", "value"):
            setattr(block.attention.self, name, torch.nn.Linear(32, 32))
        model.bert.encoder.layer.append(block)
    query = model.bert.encoder.layer[0].attention.self.query
    SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(model, 128, FixedSparsityConfig(4))
    assert isinstance(model.bert.encoder.layer[0].attention.self, BertSparseSelfAttention)
    assert model.bert.encoder.layer[0].attention.self.query is query and model.config.max_position_embeddings == 128
    SparseAttentionUtils.extend_position_embedding(model, 128)
    table = model.bert.embeddings.position_embeddings.weight
    assert table.shape == (128, 32) and torch.equal(table[64:], table[:64])


# ---- the config ----------------------------------------------------------------------------------------------------


def test_the_config_section_builds_deepspeeds_class():
    config = sparsity_config_from_dict({"mode": "variable", "block": 8, "num_random_blocks": 1,
                                        "local_window_blocks": [2, 4], "global_block_indices": [0, 3],
                                        "global_block_end_indices": [1, 5], "attention": "unidirectional"}, 4)
    assert isinstance(config, VariableSparsityConfig) and config.block == 8 and config.local_window_blocks == [2, 4]
    assert config.global_block_end_indices == [1, 5] and config.attention == "unidirectional"
    fixed = sparsity_config_from_dict({}, 2)  # DeepSpeed's default mode
    assert isinstance(fixed, FixedSparsityConfig) and fixed.num_local_blocks == 4 and fixed.block == 16
    with pytest.raises(ValueError, match='sparse_attention.num_local_blocks: not a key of mode "bigbird"'):
        sparsity_config_from_dict({"mode": "bigbird", "num_local_blocks": 2}, 4)
    with pytest.raises(ValueError, match="sparse_attention.mode"):
        sparsity_config_from_dict({"mode": "sparse"}, 4)


class _Attends(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.attention = SparseSelfAttention(FixedSparsityConfig(2, block=4), max_seq_length=16) if sparse else None

    def forward(self, x):
        y = self.proj(x).view(1, 16, 2, 4).transpose(1, 2)
        if self.attention is not None:
            y = self.attention(y, y, y)
        return y.transpose(1, 2).reshape(1, 16, 8).pow(2).mean()


def test_the_engine_takes_the_section_only_from_a_model_that_applies_it():
    config = {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.1}},
              "sparse_attention": {"mode": "fixed", "block": 4}}
    with pytest.raises(ValueError, match="sparse_attention: the section describes the model's attention"):
        dscpp.initialize(model=_Attends(False), config=config)
    engine, *_ = dscpp.initialize(model=_Attends(True), config=config)
    loss = engine(torch.randn(1, 16, 8))
    engine.backward(loss)
    engine.step()
