"""Additive attention (Bahdanau et al. 2015, eq. 6; Luong et al. 2015's "concat" score): a one-hidden-layer
scorer instead of a dot product.

Per head h, with the module's own projections as W_h (query rows of in_proj) and U_h (key rows):

    e_ij = w_h^T tanh(W_h q_i + U_h k_j)        a_ij = softmax_j(e_ij)        out_i = sum_j a_ij (V_h v_j)

w_h (head_dim,) is this kernel's parameter `score_vectors` (heads, head_dim), created in `setup_heads`. There is
no 1/sqrt(d) scale: the tanh bounds every term, and w_h learns the scale. Unlike q . k, tanh(q + k) does not
factor into a matrix product, so the scores need the (T, S, head_dim) tensor tanh(q_i + k_j): O(T S d) time and
memory. It is computed for a block of `chunk_size` queries at a time, so the extra memory of the forward is
B * H * chunk_size * S * head_dim elements (default: the block that keeps this under 2^22 elements, 16 MiB in
fp32); in training each block is recomputed in the backward (torch.utils.checkpoint), so what autograd keeps
is the scores, B * H * T * S elements, as for dot-product attention's weights, not the O(T S d) tensor.

On the CPU the fast path (zoo/attention/fast/additive.py, behind ZOO_FAST_KERNELS) computes the same scores with
tanh through the logistic function and a closed-form backward, one (batch, head) row at a time, and skips the keys
after a causal query block's last query.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, HeadLayout, Kernel
from zoo.attention.fast import additive as fast_additive
from zoo.attention.fast import use_fast_kernels
from zoo.attention.functional import causal_mask, evaluate_bias, repeat_kv
from zoo.errors import check_positive_int

# Elements of one block's tanh(q_i + k_j) tensor when chunk_size is not given (2^22 fp32 values: 16 MiB).
BLOCK_ELEMENTS = 1 << 22


def additive_scores(q: torch.Tensor, k: torch.Tensor, score_vectors: torch.Tensor) -> torch.Tensor:
    """e_ij = w_h^T tanh(q_i + k_j): q (B, H, t, D), k (B, H, S, D), score_vectors (H, D) -> (B, H, t, S)."""
    hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, t, S, D)
    return torch.matmul(hidden, score_vectors[:, None, :, None]).squeeze(-1)


class AdditiveAttention(Kernel):
    """Bahdanau attention on projected heads: self- and cross-attention, causal or not, key padding, dropout,
    need_weights, grouped key/value heads, decoding from a KVCache, and a position bias (ALiBi, T5) added to the
    scores before the softmax, as for dot-product scores.

    Args:
        chunk_size: the queries whose (chunk_size, S, head_dim) intermediate is formed at once; None: the largest
            block under 2^22 elements.
    """

    name = "additive"
    supports_cross_attention = True
    supports_causal = True
    supports_position_bias = True
    supports_packing = True
    example_options: ClassVar[tuple[dict[str, Any], ...]] = ({}, {"chunk_size": 3})

    def __init__(self, *, chunk_size: int | None = None) -> None:
        super().__init__()
        check_positive_int("attention.chunk_size (variant 'additive')", chunk_size, allow_none=True)
        self.chunk_size = chunk_size

    def setup_heads(self, heads: HeadLayout) -> None:
        super().setup_heads(heads)
        # w_h per query head, initialised as a Linear(head_dim, 1) would be.
        bound = 1.0 / math.sqrt(heads.head_dim)
        self.score_vectors = nn.Parameter(torch.empty(heads.num_heads, heads.head_dim).uniform_(-bound, bound))

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}"

    def _block(self, q: torch.Tensor, k: torch.Tensor) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        batch, heads, _, dim = q.shape
        return max(1, BLOCK_ELEMENTS // max(1, batch * heads * k.shape[2] * dim))

    def scores(self, q: torch.Tensor, k: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """All scores (B, H, T, S), a block of queries at a time (recomputed in the backward when training).
        causal: the caller masks the keys after each query, so their scores may be left unset (the fast path
        leaves them 0)."""
        w = self.score_vectors.to(q.dtype)
        if use_fast_kernels() and fast_additive.applies(q, k):
            return fast_additive.additive_scores(q, k, w, causal, self.chunk_size)
        recompute = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or w.requires_grad)
        blocks = []
        for q_block in q.split(self._block(q, k), dim=2):
            if recompute:
                blocks.append(checkpoint(additive_scores, q_block, k, w, use_reentrant=False))
            else:
                blocks.append(additive_scores(q_block, k, w))
        return torch.cat(blocks, dim=2) if len(blocks) > 1 else blocks[0]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, H, T, D), k/v (B, G, S, D) -> (B, H, T, D) and, if asked, probabilities (B, H, T, S). Causal
        with fewer queries than keys: the queries are the last positions (decoding)."""
        causal, key_padding_mask, bias, dropout_p = call.causal, call.key_padding_mask, call.bias, call.dropout_p
        need_weights = call.need_weights
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # the O(T S d) scores dwarf the copy of k and v
        scores = self.scores(q, k, causal)
        if bias is not None:  # the queries are the last positions of the keys (as full attention's)
            scores = scores + evaluate_bias(bias, q.shape[2], k.shape[2], q.device).to(scores.dtype)
        allowed = None
        if key_padding_mask is not None:
            allowed = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        if causal:
            band = causal_mask(q.shape[2], k.shape[2], q.device)
            allowed = band if allowed is None else allowed & band
        empty = None
        if allowed is not None:
            # A row with no key to attend (a padded query under a causal mask) is unmasked for the softmax and
            # zeroed after it, so neither outputs nor gradients become NaN.
            empty = ~allowed.any(dim=-1, keepdim=True)
            scores = scores.masked_fill(~(allowed | empty), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if empty is not None:
            probs = probs.masked_fill(empty, 0.0)
        dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0.0 else probs
        return dropped @ v, (probs if need_weights else None)

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New queries (B, H, t, D) attend causally to the cached keys and their own; weights (B, H, t, offset + t)."""
        key_padding_mask, need_weights, bias = call.key_padding_mask, call.need_weights, call.bias
        keys, values = cache.append(k, v, new_tokens_padding(key_padding_mask, k.shape[2]))
        return self(
            q, keys, values, causal=True, key_padding_mask=cache.key_padding_mask(), need_weights=need_weights,
            bias=bias,
        )  # fmt: skip
