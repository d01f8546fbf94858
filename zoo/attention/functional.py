"""The attention math every kernel shares: the O(n^2) masked softmax formula (the reference every fast
path is checked against), softmax attention under a boolean mask through fused SDPA, and masks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> float 0 / -inf, the form the fused CPU kernel takes without a copy."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


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


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention under a bool mask `allowed` (True = may attend, broadcastable to (B, H, T, S)).

    Query rows with no allowed key (e.g. padded queries under a causal mask) output zeros; they are
    unmasked before the softmax and zeroed after it, so neither outputs nor gradients become NaN.
    """
    empty = None
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)  # (..., T, 1)
        if bool(empty.any()):
            allowed = allowed | empty
        else:
            empty = None
    if need_weights:
        out, probs = softmax_attention(q, k, v, allowed, dropout_p)
    else:
        mask = None if allowed is None else additive_mask(allowed, q.dtype)
        out, probs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
        probs = None if probs is None else probs.masked_fill(empty, 0.0)
    return out, probs


def dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d)) v over all keys. Causal with fewer queries than keys: the queries are the
    last positions (decoding). Without a padding mask or weights this is one fused SDPA call."""
    q_len, k_len = q.shape[2], k.shape[2]
    if causal and q_len == 1:
        causal = False  # a single newest query sees every key
    if key_padding_mask is None and not need_weights and not (causal and q_len != k_len):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p), None
    allowed = None
    if key_padding_mask is not None:
        allowed = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        band = causal_mask(q_len, k_len, q.device)
        allowed = band if allowed is None else allowed & band
    return masked_attention(q, k, v, allowed, dropout_p, need_weights)
