"""The attention math every kernel shares: the O(n^2) masked softmax formula (the reference every fast
path is checked against), softmax attention under a boolean mask and an additive score bias through fused
SDPA (`sdpa`, with its CPU fast path behind the switch of zoo/attention/fast/), masks, and the expansion of
grouped key/value heads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from zoo.attention.fast import sdpa as fast_sdpa
from zoo.attention.fast import use_fast_kernels


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention; on the CPU the fast path (zoo/attention/fast/sdpa.py) picks among exact
    CPU routes by shape, dtype and whether the mask takes a gradient."""
    if use_fast_kernels() and q.device.type == "cpu":
        return fast_sdpa.cpu_sdpa(q, k, v, **options)
    return F.scaled_dot_product_attention(q, k, v, **options)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> float 0 / -inf, the form the fused CPU kernel takes without a copy."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool (True = may attend) or additive float mask as an additive float one."""
    return additive_mask(mask, dtype) if mask.dtype == torch.bool else mask


def fill_rows_(x: torch.Tensor, rows: torch.Tensor, value: float) -> torch.Tensor:
    """x[rows] = value in place, for x (*R, W) and a boolean rows (*R). On the CPU only the chosen rows are written
    (index_fill_ at their indices; a boolean index becomes a masked_fill_, a pass over all of x); elsewhere
    masked_fill_, as the indices would cost a device sync."""
    if x.device.type != "cpu":
        return x.masked_fill_(rows[..., None], value)
    x.view(-1, x.shape[-1]).index_fill_(0, rows.flatten().nonzero().squeeze(1), value)
    return x


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, G, S, D) -> (B, G * groups, S, D): key/value head g serves query heads g * groups ... (g + 1) *
    groups - 1, as Llama's repeat_kv (grouped-query attention, Ainslie et al. 2023)."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def evaluate_bias(bias, q_len: int, k_len: int, device: torch.device, start: int = 0) -> torch.Tensor:
    """A ScoreBias (zoo/attention/contract.py) at queries start + k_len - q_len ... and keys start ... start +
    k_len - 1 (the queries are the last q_len positions): (H, q_len, k_len)."""
    keys = torch.arange(start, start + k_len, device=device)
    return bias(keys[k_len - q_len :], keys)


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
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention under a bool mask `allowed` (True = may attend, broadcastable to (B, H, T, S)) with an
    additive score bias (float, broadcastable to (B, H, T, S)) if given; k and v may have grouped heads.

    Query rows with no allowed key (e.g. padded queries under a causal mask) output zeros; they are
    unmasked before the softmax and zeroed after it, so neither outputs nor gradients become NaN.
    """
    empty = None
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)  # (..., T, 1)
        # torch.export (ONNX) cannot branch on values: there empty rows are always handled, a no-op if none is
        if torch.compiler.is_exporting() or bool(empty.any()):
            allowed = allowed | empty
        else:
            empty = None
    mask = allowed
    if bias is not None:
        bias = bias.to(q.dtype)
        mask = bias if allowed is None else torch.where(allowed, bias, float("-inf"))
    if need_weights:  # the explicit formula needs every query head's keys; SDPA groups heads itself
        groups = q.shape[1] // k.shape[1]
        out, probs = softmax_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, dropout_p)
    else:
        if mask is not None:
            mask = _additive(mask, q.dtype)
        gqa = q.shape[1] != k.shape[1]
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
        probs = None
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
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias) v over all keys; k and v may have grouped heads (B, G, S, D). Causal
    with fewer queries than keys: the queries are the last positions (decoding). Without a padding mask,
    weights or bias this is one fused SDPA call; a bias (H, T, S) rides along as a float mask."""
    q_len, k_len = q.shape[2], k.shape[2]
    if causal and q_len == 1:
        causal = False  # a single newest query sees every key
    if key_padding_mask is None and not need_weights and bias is None and not (causal and q_len != k_len):
        gqa = q.shape[1] != k.shape[1]
        return sdpa(q, k, v, is_causal=causal, dropout_p=dropout_p, enable_gqa=gqa), None
    allowed = None
    if key_padding_mask is not None:
        allowed = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        band = causal_mask(q_len, k_len, q.device)
        allowed = band if allowed is None else allowed & band
    return masked_attention(q, k, v, allowed, dropout_p, need_weights, bias)
