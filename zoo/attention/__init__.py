"""zoo's shared attention core (pure PyTorch): one MultiHeadAttention, interchangeable kernels behind one
contract (contract.py, registry.py), positions, caches. Imports nothing from zoo but zoo.errors."""

from zoo.attention.axial import AxialAttention
from zoo.attention.blockwise import union_attention
from zoo.attention.cache import KVCache, LinearAttentionState, RollingKVCache, StaticKVCache
from zoo.attention.compressed import CompressedAttention
from zoo.attention.config import AttentionConfig
from zoo.attention.contract import AttentionKernel, DecodingState, Kernel, TokenLayout
from zoo.attention.core import MultiHeadAttention
from zoo.attention.full import FullAttention
from zoo.attention.functional import dot_product_attention, masked_attention, softmax_attention
from zoo.attention.linear import LinearAttention, elu_feature_map, quadratic_linear_attention
from zoo.attention.local import LocalAttention, sliding_window_attention, sliding_window_mask
from zoo.attention.positions import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    sinusoidal_positions,
)
from zoo.attention.registry import VARIANTS, build_kernel
from zoo.attention.sparse import SparseAttention

__all__ = [
    "VARIANTS",
    "AttentionConfig",
    "AttentionKernel",
    "AxialAttention",
    "CompressedAttention",
    "DecodingState",
    "FullAttention",
    "KVCache",
    "Kernel",
    "LearnedPositionalEmbedding",
    "LinearAttention",
    "LinearAttentionState",
    "LocalAttention",
    "MultiHeadAttention",
    "RollingKVCache",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "SparseAttention",
    "StaticKVCache",
    "TokenLayout",
    "build_kernel",
    "dot_product_attention",
    "elu_feature_map",
    "masked_attention",
    "quadratic_linear_attention",
    "sinusoidal_positions",
    "sliding_window_attention",
    "sliding_window_mask",
    "softmax_attention",
    "union_attention",
]
