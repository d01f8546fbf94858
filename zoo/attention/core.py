"""MultiHeadAttention: the one attention module every zoo model uses.

The variant (full, local, linear, ...) is a kernel chosen by name from the registry (zoo/attention/
registry.py) with its own options; rotary positions (optionally length-scaled) are applied to queries and
keys before any kernel, so RoPE combines with all of them; a position bias (ALiBi, T5: zoo/attention/
biases.py) is handed to every kernel that forms scores, which adds it per block. Models never branch on the
variant: they build a MultiHeadAttention from an AttentionConfig and tell it their token layout (longest
sequence, patch grid); a bias shared across layers is passed in by the stack that owns it
(zoo.nn.blocks.transformer_stack).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.cache import StaticKVCache
from zoo.attention.config import AttentionConfig
from zoo.attention.contract import AttentionCall, HeadLayout, Kernel, Placement, TokenLayout
from zoo.attention.documents import PackedDocuments
from zoo.attention.positions import RotaryEmbedding, grid_positions


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017) with interchangeable kernels.

    Parameters follow torch.nn.MultiheadAttention: one fused input projection `in_proj` (rows q, k, v)
    and `out_proj`, so weights copy across one to one, whatever the variant. Self-attention when `context`
    is None, cross-attention otherwise (no RoPE and no position bias across sequences).

    Grouped-query attention (attention.kv_heads = G, dividing num_heads = H): `in_proj.weight` has
    (H + 2 G) * head_dim rows: the H query heads, then the G key heads, then the G value heads, head_dim
    rows each (with G = H exactly the layout above). Query head h attends with key/value head h // (H / G),
    as Llama's repeat_kv: Llama's q_proj, k_proj, v_proj weights stacked in that order are `in_proj.weight`.
    Caches hold the G key/value heads.

    `attention` is an AttentionConfig (or a variant name); keyword settings (variant=, window=, rope=, ...)
    are AttentionConfig fields and options and take precedence over it. `shared_bias` is a position bias
    module shared with other layers (T5's one bias per stack); None builds this layer's own from the config.
    `qkv_bias` sets the bias of `in_proj` apart from `out_proj`'s (`bias`): Qwen2 has biases on q, k, v only.
    `qk_norm` normalises queries and keys per head with an RMSNorm before RoPE (OLMo 2, Qwen3), which keeps
    the attention logits bounded; `norm_eps` is its epsilon. `cross_attention`: this attention is called with a
    context (an encoder's output) as keys and values. What the config cannot do in this placement (causal,
    cross-attention, a patch grid, packed documents) is refused by AttentionConfig.validate, in one line.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: AttentionConfig | str | None = None,
        *,
        causal: bool = False,
        bias: bool = True,
        layout: TokenLayout | None = None,
        shared_bias: nn.Module | None = None,
        qkv_bias: bool | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        cross_attention: bool = False,
        **settings: Any,
    ) -> None:
        super().__init__()
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if dim % num_heads != 0:
            divisors = [h for h in range(1, dim + 1) if dim % h == 0]
            raise ValueError(
                f"dim must be divisible by num_heads, got dim={dim} and num_heads={num_heads}; "
                f"valid num_heads: {divisors}"
            )
        if isinstance(attention, str):
            attention = AttentionConfig(variant=attention)
        config = attention or AttentionConfig()
        if settings:
            config = config.replace(**settings)
        kv_heads = config.kv_heads or num_heads
        if num_heads % kv_heads != 0:
            divisors = [g for g in range(1, num_heads + 1) if num_heads % g == 0]
            raise ValueError(
                f"attention.kv_heads={kv_heads} must divide num_heads={num_heads}; valid choices: {divisors}"
            )
        self.config = config
        self.dim = dim
        self.num_heads = num_heads
        self.kv_heads = kv_heads
        self.head_dim = dim // num_heads
        self.causal = causal
        self.dropout = config.dropout
        self.layout = layout or TokenLayout()
        self.placement = Placement(causal, cross_attention, grid=self.layout.grid is not None)
        config.validate(self.placement)
        self.kernel: Kernel = config.build_kernel()
        self.kernel.setup(self.layout)
        self.kernel.setup_heads(HeadLayout(num_heads, kv_heads, self.head_dim))
        grid = self.layout.grid if config.rope else None
        self.rotary = None
        if config.rope:
            self.rotary = RotaryEmbedding(
                self.head_dim, config.rope_base, 2 if grid else 1, config.rope_scaling, config.rope_factor,
                self.layout.max_length, config.rope_parameters,
            )  # fmt: skip
        if grid is not None:  # 2-D rotary positions of the patches (the prefix tokens sit at (0, 0))
            self.register_buffer("positions", grid_positions(grid, self.layout.prefix_tokens), persistent=False)
        else:
            self.positions = None
        if shared_bias is not None and config.position_bias is None:
            raise ValueError("a shared position bias was given, but attention.position_bias is null")
        # A shared module is registered in every layer that uses it, like tied weights.
        self.position_bias = shared_bias if shared_bias is not None else config.build_position_bias(num_heads, causal)
        in_bias = bias if qkv_bias is None else qkv_bias
        self.in_proj = nn.Linear(dim, (num_heads + 2 * kv_heads) * self.head_dim, bias=in_bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=norm_eps) if qk_norm else None

    @property
    def variant(self) -> str:
        return self.kernel.name

    def extra_repr(self) -> str:
        rope = self.rotary is not None
        return (
            f"dim={self.dim}, heads={self.num_heads}, kv_heads={self.kv_heads}, variant={self.variant}, "
            f"causal={self.causal}, rope={rope}"
        )

    def new_cache(self, cross_attention: bool = False) -> Any:
        """A fresh decoding state: the kernel's own for self-attention, a static one for cross-attention."""
        return StaticKVCache() if cross_attention else self.kernel.new_cache()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape  # (B, T, heads * hd) -> (B, heads, T, hd)
        return x.view(batch, length, -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        cache: Any = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
        documents: PackedDocuments | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, C); context (B, S, C) or None; key_padding_mask (B, S) bool, True = padding.

        With `cache` (from `new_cache`), x holds only the new tokens and attends to everything cached.
        `positions` ((T,) or (T, axes) ints) overrides the default 0..T-1 (+ cache offset) for RoPE; a
        position bias always follows the token order.
        `documents` (zoo/attention/documents.py, self-attention): x packs several documents per row; each attends
        within itself at its own positions, exactly as if it were run alone (the kernel runs on the documents
        laid out as a batch).
        Returns the output (B, T, C), or (output, probabilities (B, H, T, S)) if need_weights.
        """
        batch, length, _ = x.shape
        dropout_p = self.dropout if self.training else 0.0
        if documents is not None:
            if context is not None:
                raise ValueError("packed documents are for self-attention; cross-attention takes document_ids=None")
            return self._forward_documents(x, documents, key_padding_mask, cache, need_weights, positions, dropout_p)
        if context is None:
            if positions is not None and self.position_bias is not None:
                raise ValueError("explicit positions are RoPE's; attention.position_bias follows the token order")
            q, k, v = self._heads_qkv(x)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.rotary is not None:  # default positions continue after the cached tokens
                offset = cache.offset if cache is not None else 0
                if positions is None and self.positions is not None:
                    positions = self.positions[offset : offset + length]
                q, k = self.rotary.rotate_queries_keys(q, k, positions, offset)
            call = AttentionCall(self.causal, key_padding_mask, dropout_p, need_weights, self.position_bias)
            if cache is not None:
                out, weights = self.kernel.decode(q, k, v, cache, call)
            else:
                out, weights = self.kernel(q, k, v, call)
        else:
            if not self.placement.cross:  # built as a self-attention, called with a context
                self.config.validate(replace(self.placement, cross=True, causal=False))
            sizes = [self.dim, 2 * self.kv_heads * self.head_dim]
            w_q, w_kv = self.in_proj.weight.split(sizes)
            b_q, b_kv = self.in_proj.bias.split(sizes) if self.in_proj.bias is not None else (None, None)
            q = self._heads(F.linear(x, w_q, b_q))
            if self.q_norm is not None:
                q = self.q_norm(q)
            if cache is not None and cache.keys is not None:
                k, v = cache.keys, cache.values
            else:
                k, v = (self._heads(t) for t in F.linear(context, w_kv, b_kv).chunk(2, dim=-1))
                if self.k_norm is not None:
                    k = self.k_norm(k)
                if cache is not None:
                    cache.keys, cache.values = k, v
            out, weights = self.kernel(q, k, v, AttentionCall(False, key_padding_mask, dropout_p, need_weights))
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.dim))
        return (out, weights) if need_weights else out

    def _forward_documents(
        self, x, documents: PackedDocuments, key_padding_mask, cache, need_weights, positions, dropout_p
    ) -> torch.Tensor:
        """Self-attention within each packed document: the documents as a batch (N, heads, L, head_dim), their
        padding as key padding, default positions 0..L-1 (RoPE and the position bias restart per document)."""
        self.config.validate(replace(self.placement, packed=True))
        if cache is not None or need_weights or positions is not None or self.positions is not None:
            raise ValueError("packed documents take no cache, need_weights, explicit positions or patch grid")
        q, k, v = self._heads_qkv(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = documents.unpack(q), documents.unpack(k), documents.unpack(v)
        if self.rotary is not None:
            q, k = self.rotary.rotate_queries_keys(q, k)
        padding = documents.key_padding_mask(key_padding_mask)
        out, _ = self.kernel(q, k, v, AttentionCall(self.causal, padding, dropout_p, bias=self.position_bias))
        batch, length, _ = x.shape
        return self.out_proj(documents.pack(out).transpose(1, 2).reshape(batch, length, self.dim))

    def _heads_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv_dim = self.kv_heads * self.head_dim
        return tuple(self._heads(t) for t in self.in_proj(x).split([self.dim, kv_dim, kv_dim], dim=-1))
