"""zoo's shared attention core: one MultiHeadAttention, interchangeable kernels, positions, caches."""

from zoo.attention.cache import KVCache, LinearAttentionState, RollingKVCache, StaticKVCache
from zoo.attention.core import AttentionConfig, MultiHeadAttention
from zoo.attention.full import FullAttention, dot_product_attention, softmax_attention
from zoo.attention.linear import LinearAttention, elu_feature_map, quadratic_linear_attention
from zoo.attention.local import LocalAttention, sliding_window_attention, sliding_window_mask
from zoo.attention.positions import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    sinusoidal_positions,
)
from zoo.attention.variants import VARIANTS, get_variant

__all__ = [
    "VARIANTS",
    "AttentionConfig",
    "FullAttention",
    "KVCache",
    "LearnedPositionalEmbedding",
    "LinearAttention",
    "LinearAttentionState",
    "LocalAttention",
    "MultiHeadAttention",
    "RollingKVCache",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "StaticKVCache",
    "dot_product_attention",
    "elu_feature_map",
    "get_variant",
    "quadratic_linear_attention",
    "sinusoidal_positions",
    "sliding_window_attention",
    "sliding_window_mask",
    "softmax_attention",
]
