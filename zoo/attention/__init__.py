"""zoo's shared attention core: one MultiHeadAttention, interchangeable kernels, positions, caches."""

from zoo.attention.cache import KVCache, StaticKVCache
from zoo.attention.core import AttentionConfig, MultiHeadAttention
from zoo.attention.full import softmax_attention
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
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "StaticKVCache",
    "get_variant",
    "sinusoidal_positions",
    "softmax_attention",
]
