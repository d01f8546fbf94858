"""Transformer building blocks shared by every model: MLP, drop path, and the residual block.

One block serves encoder (self-attention + MLP), decoder (masked self-attention + cross-attention
+ MLP), pre-norm (GPT, ViT, CLIP) and post-norm (Vaswani et al. 2017) alike; its attention always
comes from zoo.attention. Models build their stacks of blocks with `transformer_stack`, which gives all
blocks of a stack one position bias when the attention config shares it (T5), so that no model needs to
know about biases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout
from zoo.nn.activations import get_activation
from zoo.nn.dropout import Dropout


class MLP(nn.Module):
    """Position-wise feed-forward network: Linear -> activation -> dropout -> Linear."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = get_activation(activation)
        self.dropout = Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop a sample's whole residual branch in training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class TransformerBlock(nn.Module):
    """Residual block: self-attention, optional cross-attention, MLP; pre- or post-norm.

    Submodule names and dropout placement follow torch.nn.TransformerEncoderLayer /
    TransformerDecoderLayer so that the two compute the same function with copied weights.

    Args:
        dim: model width (embedding size of each token).
        num_heads: attention heads (query heads; key/value heads come from `attention.kv_heads`).
        mlp_dim: hidden width of the MLP (None: 4 * dim).
        attention: the self-attention's variant and options (None: full attention's defaults).
        causal: each token attends to earlier positions only (decoders).
        cross_attention: add a cross-attention sublayer over an encoder's memory (`context` in forward).
        cross_attention_variant: the cross-attention's variant (it attends to the whole memory).
        norm_first: pre-norm (LayerNorm before each sublayer) or post-norm (after the residual add).
        dropout: dropout after each sublayer and inside the MLP.
        drop_path: stochastic depth, the probability of skipping a sublayer's residual branch per sample.
        activation: the MLP's activation (zoo/nn/activations.py).
        bias: biases in the linear layers and LayerNorms.
        norm_eps: LayerNorm epsilon.
        layout: the token layout (sequence or patch grid with prefix tokens) for positions and patterns.
        shared_bias: a position-bias module shared by all blocks (e.g. T5's table), or None.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int | None = None,
        attention: AttentionConfig | None = None,
        causal: bool = False,
        cross_attention: bool = False,
        cross_attention_variant: str = "full",
        norm_first: bool = True,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
        norm_eps: float = 1e-5,
        layout: TokenLayout | None = None,
        shared_bias: nn.Module | None = None,
    ) -> None:
        super().__init__()
        attention = attention or AttentionConfig()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            dim, num_heads, attention, causal=causal, bias=bias, layout=layout, shared_bias=shared_bias
        )
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.cross_attn = None
        if cross_attention:
            # The encoder's memory is attended to as a whole: no positions, none of the self-attention's options;
            # its key/value heads are grouped as the self-attention's.
            cross = AttentionConfig(
                variant=cross_attention_variant, dropout=attention.dropout, kv_heads=attention.kv_heads
            )
            self.cross_attn = MultiHeadAttention(dim, num_heads, cross, bias=bias)
            self.norm_cross = nn.LayerNorm(dim, eps=norm_eps, bias=bias)
            self.dropout_cross = Dropout(dropout)
        self.mlp = MLP(dim, mlp_dim or 4 * dim, activation, dropout, bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, bias=bias)
        self.dropout2 = Dropout(dropout)
        self.drop_path = DropPath(drop_path)

    def new_cache(self) -> dict[str, Any]:
        cache = {"self": self.self_attn.new_cache()}
        if self.cross_attn is not None:
            cache["cross"] = self.cross_attn.new_cache(cross_attention=True)
        return cache

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_padding_mask: torch.Tensor | None = None,
        cache: dict[str, Any] | None = None,
        positions: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """x (B, T, C); context (B, S, C) for cross-attention; masks (B, T) / (B, S) bool, True = pad.

        With need_weights, also returns the attention probabilities {"self": (B, H, T, T), "cross":
        (B, H, T, S)} (slower: for inspection, e.g. alignment plots).
        """
        self_cache = cache["self"] if cache is not None else None
        weights: dict[str, torch.Tensor] = {}

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            h = self.self_attn(
                h, key_padding_mask=key_padding_mask, cache=self_cache, positions=positions, need_weights=need_weights
            )
            if need_weights:
                h, weights["self"] = h
            return self.drop_path(self.dropout1(h))

        def cross_attention(h: torch.Tensor) -> torch.Tensor:
            cross_cache = cache["cross"] if cache is not None else None
            h = self.cross_attn(
                h, context, key_padding_mask=context_padding_mask, cache=cross_cache, need_weights=need_weights
            )
            if need_weights:
                h, weights["cross"] = h
            return self.drop_path(self.dropout_cross(h))

        def feed_forward(h: torch.Tensor) -> torch.Tensor:
            return self.drop_path(self.dropout2(self.mlp(h)))

        if self.norm_first:
            x = x + self_attention(self.norm1(x))
            if self.cross_attn is not None:
                x = x + cross_attention(self.norm_cross(x))
            x = x + feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self_attention(x))
            if self.cross_attn is not None:
                x = self.norm_cross(x + cross_attention(x))
            x = self.norm2(x + feed_forward(x))
        return (x, weights) if need_weights else x


def transformer_stack(
    depth: int,
    dim: int,
    num_heads: int,
    attention: AttentionConfig | None = None,
    *,
    causal: bool = False,
    drop_path: float | Sequence[float] = 0.0,
    **block_options: Any,
) -> nn.ModuleList:
    """`depth` TransformerBlocks forming one stack (an encoder, a decoder); block_options are the blocks' other
    arguments. drop_path is one rate for all blocks or one per block. With attention.share_bias (T5) every
    block gets the same position bias module, built here once."""
    attention = attention or AttentionConfig()
    rates = [drop_path] * depth if isinstance(drop_path, (int, float)) else list(drop_path)
    if len(rates) != depth:
        raise ValueError(f"drop_path needs one rate per block ({depth}), got {len(rates)}")
    shared = attention.build_position_bias(num_heads, causal) if attention.share_bias else None
    return nn.ModuleList(
        TransformerBlock(
            dim, num_heads, attention=attention, causal=causal, drop_path=rate, shared_bias=shared, **block_options
        )
        for rate in rates
    )
