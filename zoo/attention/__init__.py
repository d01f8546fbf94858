"""zoo's shared attention core (pure PyTorch): one MultiHeadAttention, interchangeable kernels behind one
contract (contract.py, registry.py), positions, caches. Imports nothing from zoo but zoo.errors."""

from zoo.attention.additive import AdditiveAttention
from zoo.attention.axial import AxialAttention
from zoo.attention.biases import ALiBi, T5RelativeBias, alibi_slopes, relative_position_bucket
from zoo.attention.blockwise import union_attention
from zoo.attention.cache import KVCache, LinearAttentionState, RollingKVCache, StaticKVCache
from zoo.attention.compressed import CompressedAttention
from zoo.attention.config import AttentionConfig
from zoo.attention.contract import (
    AttentionCall,
    DecodingState,
    HeadLayout,
    Kernel,
    Placement,
    ScoreBias,
    TokenLayout,
    kernel_notices,
)
from zoo.attention.core import MultiHeadAttention
from zoo.attention.documents import PackedDocuments
from zoo.attention.feature_maps import elu_feature_map, favor_feature_map, orthogonal_random_features
from zoo.attention.full import FullAttention
from zoo.attention.functional import dot_product_attention, masked_attention, repeat_kv, softmax_attention
from zoo.attention.linear import LinearAttention, quadratic_linear_attention
from zoo.attention.local import LocalAttention
from zoo.attention.lsh import LSHAttention
from zoo.attention.positions import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    sinusoidal_positions,
)
from zoo.attention.registry import VARIANTS, build_kernel
from zoo.attention.routing import RoutingAttention
from zoo.attention.sliding_window import sliding_window_attention, sliding_window_mask
from zoo.attention.sparse import SparseAttention

__all__ = [
    "VARIANTS",
    "ALiBi",
    "AdditiveAttention",
    "AttentionConfig",
    "AttentionCall",
    "AxialAttention",
    "CompressedAttention",
    "DecodingState",
    "FullAttention",
    "HeadLayout",
    "Placement",
    "KVCache",
    "Kernel",
    "LSHAttention",
    "LearnedPositionalEmbedding",
    "LinearAttention",
    "LinearAttentionState",
    "LocalAttention",
    "MultiHeadAttention",
    "PackedDocuments",
    "RollingKVCache",
    "RotaryEmbedding",
    "RoutingAttention",
    "ScoreBias",
    "SinusoidalPositionalEmbedding",
    "SparseAttention",
    "StaticKVCache",
    "T5RelativeBias",
    "TokenLayout",
    "alibi_slopes",
    "build_kernel",
    "dot_product_attention",
    "elu_feature_map",
    "favor_feature_map",
    "kernel_notices",
    "masked_attention",
    "orthogonal_random_features",
    "quadratic_linear_attention",
    "relative_position_bucket",
    "repeat_kv",
    "sinusoidal_positions",
    "sliding_window_attention",
    "sliding_window_mask",
    "softmax_attention",
    "union_attention",
]
