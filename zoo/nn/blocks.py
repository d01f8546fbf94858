"""Transformer building blocks shared by every model: MLP, drop path, and the residual block.

One block serves encoder (self-attention + MLP), decoder (masked self-attention + cross-attention
+ MLP), pre-norm (GPT, ViT, CLIP) and post-norm (Vaswani et al. 2017) alike; its attention always
comes from zoo.attention. The Llama family's choices are options of the same block: RMSNorm for LayerNorm,
a gated MLP (SwiGLU, GeGLU) for the GELU one, biases per projection, RMSNorm of queries and keys. Models
build their stacks with `transformer_stack` from one `BlockConfig` (what the blocks of a stack share), which gives
all blocks of a stack one position bias when the attention config shares it (T5), so that no model needs to know
about biases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from zoo.attention import AttentionConfig, MultiHeadAttention, PackedDocuments, TokenLayout
from zoo.errors import check_choice
from zoo.nn.activations import get_activation
from zoo.nn.dropout import Dropout

NORMS = ("layernorm", "rmsnorm")
# gelu: the two-layer MLP of GPT-2 / ViT (its `activation` picks gelu, gelu_tanh, relu, ...); swiglu, geglu: gated.
MLPS = ("gelu", "swiglu", "geglu")
GATE_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu"}


def build_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """layernorm (Ba et al. 2016) or rmsnorm (Zhang & Sennrich 2019: no centring, no bias; LLaMA)."""
    check_choice("norm", kind, NORMS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    return nn.LayerNorm(dim, eps=eps, bias=bias)


def mlp_hidden_dim(kind: str, dim: int) -> int:
    """The usual hidden size: 4 dim; for a gated MLP 2/3 of that (same parameters as the ungated one, Shazeer
    2020), rounded up to a multiple of 64 as LLaMA rounds to its `multiple_of`."""
    check_choice("mlp", kind, MLPS)
    if kind == "gelu":
        return 4 * dim
    return -(-(8 * dim) // (3 * 64)) * 64


def build_mlp(
    kind: str,
    dim: int,
    hidden_dim: int | None = None,
    activation: str = "gelu",
    dropout: float = 0.0,
    bias: bool = True,
) -> nn.Module:
    """The MLP of kind gelu (with `activation`), swiglu or geglu; hidden_dim None follows `mlp_hidden_dim`."""
    hidden_dim = hidden_dim or mlp_hidden_dim(kind, dim)
    if kind == "gelu":
        return MLP(dim, hidden_dim, activation, dropout, bias)
    return GatedMLP(dim, hidden_dim, GATE_ACTIVATIONS[kind], dropout, bias)


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


class GatedMLP(nn.Module):
    """Gated linear unit MLP (Shazeer 2020, "GLU Variants Improve Transformer"): fc2(act(gate(x)) * fc1(x)).
    silu gives SwiGLU (LLaMA, Mistral, Qwen2), gelu GeGLU; gate, fc1, fc2 are LLaMA's gate_proj, up_proj,
    down_proj."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu", dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = get_activation(activation)
        self.dropout = Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.act(self.gate(x)) * self.fc1(x)))


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


@dataclass(frozen=True)
class BlockConfig:
    """What the blocks of one stack share: one object instead of a long list of arguments, built once per stack by
    the model from its own config.

    Args:
        dim: model width (embedding size of each token).
        num_heads: attention heads (query heads; key/value heads come from `attention.kv_heads`).
        mlp_dim: hidden width of the MLP (None: mlp_hidden_dim's rule: 4 * dim, or 8/3 * dim for gated MLPs).
        attention: the self-attention's variant and options.
        causal: each token attends to earlier positions only (decoders).
        cross_attention: the variant of a cross-attention sublayer over an encoder's memory (`context` in forward;
            it attends to the whole memory); None: no cross-attention.
        norm_first: pre-norm (LayerNorm before each sublayer) or post-norm (after the residual add).
        dropout: dropout after each sublayer and inside the MLP.
        activation: the MLP's activation (zoo/nn/activations.py).
        bias: biases in the linear layers and norms.
        norm_eps: the norms' epsilon.
        layout: the token layout (sequence or patch grid with prefix tokens) for positions and patterns.
        norm: layernorm | rmsnorm (every norm of the block).
        mlp: gelu (ungated, with `activation`) | swiglu | geglu.
        qkv_bias: biases of the q/k/v projection alone (Qwen2); None: as `bias`.
        qk_norm: RMSNorm of queries and keys per head (OLMo 2, Qwen3).
        checkpointing: recompute the block in the backward instead of keeping its activations (training only).
    """

    dim: int
    num_heads: int
    mlp_dim: int | None = None
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    causal: bool = False
    cross_attention: str | None = None
    norm_first: bool = True
    dropout: float = 0.0
    activation: str = "gelu"
    bias: bool = True
    norm_eps: float = 1e-5
    layout: TokenLayout | None = None
    norm: str = "layernorm"
    mlp: str = "gelu"
    qkv_bias: bool | None = None
    qk_norm: bool = False
    checkpointing: bool = False

    def __post_init__(self) -> None:
        check_choice("norm", self.norm, NORMS)
        check_choice("mlp", self.mlp, MLPS)


class TransformerBlock(nn.Module):
    """Residual block: self-attention, optional cross-attention, MLP; pre- or post-norm.

    Submodule names and dropout placement follow torch.nn.TransformerEncoderLayer /
    TransformerDecoderLayer so that the two compute the same function with copied weights.

    Args:
        config: what the blocks of the stack share (BlockConfig).
        drop_path: stochastic depth, the probability of skipping a sublayer's residual branch per sample (it
            rises over the blocks of a stack).
        shared_bias: a position-bias module shared by all blocks of the stack (e.g. T5's table), or None.
    """

    def __init__(self, config: BlockConfig, drop_path: float = 0.0, shared_bias: nn.Module | None = None) -> None:
        super().__init__()
        c = config
        self.config = config
        self.norm_first = c.norm_first
        self.checkpointing = c.checkpointing  # set_checkpointing switches it on a built model
        self.self_attn = MultiHeadAttention(
            c.dim, c.num_heads, c.attention, causal=c.causal, bias=c.bias, layout=c.layout, shared_bias=shared_bias,
            qkv_bias=c.qkv_bias, qk_norm=c.qk_norm, norm_eps=c.norm_eps,
        )  # fmt: skip
        self.norm1 = build_norm(c.norm, c.dim, c.norm_eps, c.bias)
        self.dropout1 = Dropout(c.dropout)
        self.cross_attn = None
        if c.cross_attention is not None:
            # The encoder's memory is attended to as a whole: no positions, none of the self-attention's options;
            # its key/value heads are grouped as the self-attention's.
            cross = AttentionConfig(
                variant=c.cross_attention, dropout=c.attention.dropout, kv_heads=c.attention.kv_heads
            )
            self.cross_attn = MultiHeadAttention(
                c.dim, c.num_heads, cross, bias=c.bias, qkv_bias=c.qkv_bias, qk_norm=c.qk_norm, norm_eps=c.norm_eps,
                cross_attention=True,
            )  # fmt: skip
            self.norm_cross = build_norm(c.norm, c.dim, c.norm_eps, c.bias)
            self.dropout_cross = Dropout(c.dropout)
        self.mlp = build_mlp(c.mlp, c.dim, c.mlp_dim, c.activation, c.dropout, c.bias)
        self.norm2 = build_norm(c.norm, c.dim, c.norm_eps, c.bias)
        self.dropout2 = Dropout(c.dropout)
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
        documents: PackedDocuments | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """x (B, T, C); context (B, S, C) for cross-attention; masks (B, T) / (B, S) bool, True = pad.

        With need_weights, also returns the attention probabilities {"self": (B, H, T, T), "cross":
        (B, H, T, S)} (slower: for inspection, e.g. alignment plots). `documents`: x packs several documents per
        row, and self-attention stays within each (zoo/attention/documents.py).
        """
        if self.checkpointing and self.training and torch.is_grad_enabled() and cache is None and not need_weights:
            # Activation checkpointing (Chen et al. 2016): keep the block's input only, recompute the rest in the
            # backward. Non-reentrant, so that it works with inputs that need no gradient and with kwargs.
            return torch.utils.checkpoint.checkpoint(
                self._forward, x, key_padding_mask, context, context_padding_mask, None, positions, False, documents,
                use_reentrant=False,
            )  # fmt: skip
        return self._forward(
            x, key_padding_mask, context, context_padding_mask, cache, positions, need_weights, documents
        )

    def _forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        context: torch.Tensor | None,
        context_padding_mask: torch.Tensor | None,
        cache: dict[str, Any] | None,
        positions: torch.Tensor | None,
        need_weights: bool,
        documents: PackedDocuments | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self_cache = cache["self"] if cache is not None else None
        weights: dict[str, torch.Tensor] = {}

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            h = self.self_attn(
                h,
                key_padding_mask=key_padding_mask,
                cache=self_cache,
                positions=positions,
                need_weights=need_weights,
                documents=documents,
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


def set_checkpointing(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch activation checkpointing on or off in every TransformerBlock of `model`; returns the model."""
    for module in model.modules():
        if isinstance(module, TransformerBlock):
            module.checkpointing = enabled
    return model


def transformer_stack(config: BlockConfig, depth: int, drop_path: float | Sequence[float] = 0.0) -> nn.ModuleList:
    """`depth` TransformerBlocks of one config forming one stack (an encoder, a decoder). drop_path is one rate for
    all blocks or one per block. With attention.share_bias (T5) every block gets the same position bias module,
    built here once."""
    rates = [drop_path] * depth if isinstance(drop_path, (int, float)) else list(drop_path)
    if len(rates) != depth:
        raise ValueError(f"drop_path needs one rate per block ({depth}), got {len(rates)}")
    attention = config.attention
    shared = attention.build_position_bias(config.num_heads, config.causal) if attention.share_bias else None
    return nn.ModuleList(TransformerBlock(config, drop_path=rate, shared_bias=shared) for rate in rates)
