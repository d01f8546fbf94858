"""Full softmax attention through PyTorch's fused scaled_dot_product_attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from zoo.attention.cache import KVCache


def padding_to_additive_mask(key_padding_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) bool, True = padding -> (B, 1, 1, S) float mask with -inf at padded keys."""
    mask = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    mask = mask.masked_fill(key_padding_mask, float("-inf"))
    return mask[:, None, None, :]


def causal_mask(q_len: int, k_len: int, device: torch.device, offset: int | None = None) -> torch.Tensor:
    """(q_len, k_len) bool, True = may attend. Query i sits at position offset + i (default: the last
    q_len positions of the keys), so a chunk of new queries sees all cached keys and itself."""
    if offset is None:
        offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    return torch.arange(k_len, device=device)[None, :] <= rows


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The O(n^2) textbook formula softmax(q k^T / sqrt(d) + mask) v, returning the probabilities too.

    `mask` is bool (True = may attend) or additive float, broadcastable to (B, H, T, S). Rows with no
    allowed key give zeros, as the fused kernels do.
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_p > 0.0:
        probs_dropped = F.dropout(probs, p=dropout_p)
        return probs_dropped @ v, probs
    return probs @ v, probs


class FullAttention:
    """softmax(q k^T / sqrt(d)) v over all keys: O(n^2) time, fused kernels keep memory O(n)."""

    name = "full"
    supports_cross_attention = True

    def __init__(self, window: int | None = None, chunk_size: int | None = None) -> None:
        del window, chunk_size  # full attention sees every key

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, H, T, D), k/v (B, H, S, D) -> (B, H, T, D) and, if asked, probabilities (B, H, T, S)."""
        mask = None
        if key_padding_mask is not None:
            mask = padding_to_additive_mask(key_padding_mask, q.dtype)
            if causal:
                allowed = causal_mask(q.shape[2], k.shape[2], q.device)
                mask = mask.masked_fill(~allowed, float("-inf"))
        if need_weights:
            if causal and mask is None:
                mask = causal_mask(q.shape[2], k.shape[2], q.device)
            return softmax_attention(q, k, v, mask, dropout_p)
        if mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            if key_padding_mask.all(dim=-1).any():  # rows with no key at all: zeros, not NaN
                out = out.nan_to_num(0.0)
            return out, None
        if causal and q.shape[2] != k.shape[2]:
            bool_mask = causal_mask(q.shape[2], k.shape[2], q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, dropout_p=dropout_p), None
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p), None

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: KVCache,
        *,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New queries/keys/values (B, H, t, D) attend causally to the cache plus themselves."""
        keys, values = cache.append(k, v)
        causal = q.shape[2] > 1
        return self(q, keys, values, causal=causal, key_padding_mask=key_padding_mask, need_weights=need_weights)
