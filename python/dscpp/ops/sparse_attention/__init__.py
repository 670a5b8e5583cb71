"""dscpp.ops.sparse_attention: DeepSpeed's block-sparse attention (deepspeed.ops.sparse_attention of the releases
that had it): the sparsity layouts (SparsityConfig and its Dense / Fixed / Variable / BigBird / BSLongformer /
LocalSlidingWindow kinds), SparseSelfAttention and BertSparseSelfAttention, SparseAttentionUtils. The layouts are
built by the C++ engine's rules (dscpp/sparse_attention/sparsity_config.h) with this process's `random` drawing the
random blocks, and the attention computes only the layout's blocks (block_sparse_attention.h) on any device and
floating dtype — not only fp16 on a GPU, as DeepSpeed's Triton kernels did."""
from .sparsity_config import (BigBirdSparsityConfig, BSLongformerSparsityConfig, DenseSparsityConfig,  # noqa: F401
                              FixedSparsityConfig, LocalSlidingWindowSparsityConfig, SparsityConfig,
                              VariableSparsityConfig, sparsity_config_from_dict)
from .sparse_self_attention import SparseSelfAttention  # noqa: F401
from .bert_sparse_self_attention import BertSparseSelfAttention  # noqa: F401
from .sparse_attention_utils import SparseAttentionUtils  # noqa: F401
