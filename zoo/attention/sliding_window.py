"""The sliding window as functions: each query sees only the keys within `window` positions.

Causal: the previous `window` positions including itself; bidirectional: `window // 2` on each side
(the local band of Longformer, Beltagy et al. 2020; the sliding window of Mistral, Jiang et al. 2023).
Exactly full softmax attention under the banded mask, computed blockwise in O(n * window) time and
memory: no (n, n) tensor is ever allocated. A position bias (zoo/attention/contract.py) is evaluated per
query block, for that block's keys only; grouped key/value heads stay grouped (SDPA's enable_gqa). On the
CPU without key padding, dropout or a learned bias, the fast path (zoo/attention/fast/band.py) runs the same
blocks through the fused kernel a chunk at a time, with O(n) forward+backward memory. The kernel that uses them
is LocalAttention (zoo/attention/local.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from zoo.attention.blockwise import blocked_windows
from zoo.attention.contract import ScoreBias
from zoo.attention.fast import band as fast_band
from zoo.attention.fast import use_fast_kernels
from zoo.attention.functional import additive_mask, dot_product_attention, evaluate_bias, masked_attention, sdpa

# Queries per block, chosen by measurement (`experiments/attention_benchmark.py --rows local`; figures in
# experiments/results/recipes.md): the fused backward zero-fills key/value gradients of size
# (n / block) * (block + window), so neither small nor large blocks win.
DEFAULT_BLOCK_SIZE = 64


def band(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """The sliding window as a pattern: True where the query may attend to the key (broadcasting positions)."""
    distance = query_positions - key_positions
    if causal:
        return (distance >= 0) & (distance < window)
    return distance.abs() <= window // 2


def sliding_window_mask(
    q_len: int, k_len: int, window: int, causal: bool, device: torch.device | None = None
) -> torch.Tensor:
    """(q_len, k_len) bool band, True = may attend; the queries sit at the last q_len key positions."""
    rows = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return band(rows, torch.arange(k_len, device=device)[None, :], window, causal)


def band_extent(window: int, causal: bool, length: int) -> tuple[int, int]:
    """Keys taken left and right of a query block, clipped to the sequence (farther keys do not exist).

    Causal takes `window` keys on the left although the farthest is always masked: blocks of
    block + window keys measured faster in the fused kernel than block + window - 1.
    """
    if causal:
        return min(window, length - 1), 0
    half = min(window // 2, length - 1)
    return half, half


def _block_allowed(batch, length, window, causal, block, key_padding_mask, device) -> torch.Tensor:
    """(B * n_blocks, block, keys) bool: the band, restricted to real keys of the block's own sequence (query i of a
    block sits `left` positions after its window's first key)."""
    n_blocks = -(-length // block)
    padded = n_blocks * block
    left, right = band_extent(window, causal, length)
    # Which sequence each flat key belongs to; -1 for padding (added here or by key_padding_mask).
    owner = torch.full((left + batch * padded + right,), -1, dtype=torch.long, device=device)
    body = owner[left : left + batch * padded].view(batch, padded)[:, :length]
    body.copy_(torch.arange(batch, device=device)[:, None].expand(batch, length))
    if key_padding_mask is not None:
        body.masked_fill_(key_padding_mask.bool(), -1)
    block_owner = torch.arange(batch, device=device).repeat_interleave(n_blocks)
    real_key = owner.unfold(0, left + block + right, block) == block_owner[:, None]  # (B * n_blocks, keys)
    queries = left + torch.arange(block, device=device)[:, None]
    allowed = band(queries, torch.arange(left + block + right, device=device)[None, :], window, causal)
    return allowed & real_key[:, None, :]


@functools.lru_cache(maxsize=4)
def _cached_block_mask(batch, length, window, causal, block, device, dtype, inference: bool) -> torch.Tensor:
    """Additive mask of all blocks without padding (training repeats shapes); inference-mode tensors
    are kept apart because autograd cannot save them."""
    del inference  # part of the cache key only
    allowed = _block_allowed(batch, length, window, causal, block, None, device)
    # Query rows past the end of the sequence may see no key at all; let them see every key of the
    # block instead of producing NaN (their outputs are dropped).
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return additive_mask(allowed, dtype)[:, None]


def _blockwise_sliding_window(
    q, k, v, window, causal, key_padding_mask, dropout_p, block: int, bias=None, start=0, forward_block=None
) -> torch.Tensor:
    """Query blocks folded into the batch dimension, so one 4-D SDPA call runs the fused CPU kernel
    (5-D inputs would fall back to the slow math path); each block attends to its block + window keys.
    Token i sits at position start + i (for the bias). `forward_block`: the fast path's forward blocks."""
    batch, heads, length, dim = q.shape
    block = min(block, length)
    left, right = band_extent(window, causal, length)
    if use_fast_kernels() and fast_band.applies(q, key_padding_mask, dropout_p, bias):
        extent = (left, right)
        return fast_band.chunked_band(q, k, v, band, window, causal, extent, block, forward_block, bias, start)
    n_blocks = -(-length // block)
    padded = n_blocks * block
    keys = blocked_windows(k, left, right, block, n_blocks)  # (B * nb, G, K, D)
    values = blocked_windows(v, left, right, block, n_blocks)
    block_bias = None
    if bias is not None:  # every block's queries and keys in one call: (nb, H, C, K), repeated over the batch
        first = start + block * torch.arange(n_blocks, device=q.device)[:, None]  # (nb, 1)
        query_positions = first + torch.arange(block, device=q.device)
        key_positions = first - left + torch.arange(left + block + right, device=q.device)
        block_bias = bias(query_positions, key_positions).to(q.dtype).repeat(batch, 1, 1, 1)  # (B * nb, H, C, K)
    queries = q.transpose(1, 2)  # (B, n, H, D)
    if padded != length:
        queries = F.pad(queries, (0, 0, 0, 0, 0, padded - length))
    queries = queries.reshape(batch * n_blocks, block, heads, dim).transpose(1, 2)  # (B * nb, H, C, D)
    if key_padding_mask is None:
        mask = _cached_block_mask(
            batch, length, window, causal, block, q.device, q.dtype, torch.is_inference_mode_enabled()
        )
        if block_bias is not None:
            mask = mask + block_bias
        gqa = heads != k.shape[1]
        out = sdpa(queries, keys, values, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
    else:
        allowed = _block_allowed(batch, length, window, causal, block, key_padding_mask, q.device)
        out, _ = masked_attention(queries, keys, values, allowed[:, None], dropout_p, bias=block_bias)
    # The fused kernel lays its output out as (B * nb, C, H, D), so this reshape is a view there.
    out = out.transpose(1, 2).reshape(batch, padded, heads, dim)[:, :length]
    return out.transpose(1, 2)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    block_size: int | None = None,
    bias: ScoreBias | None = None,
    start: int = 0,
    dense: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention of each query over the keys within `window` positions; returns (out (B, H, T, D), weights).

    Args:
        q: queries (B, H, T, D), the last T of the S positions (T < S: decoding after cached keys).
        k: keys (B, G, S, D), G dividing H (grouped key/value heads).
        v: values (B, G, S, D).
        window: keys per query: the previous `window` including itself (causal), `window // 2` each side otherwise.
        causal: attend to earlier positions only.
        key_padding_mask: (B, S) bool, True = padding (never attended).
        dropout_p: attention dropout probability.
        need_weights: also return the weights (B, H, T, S); computed under the dense band mask, O(T S) memory.
        block_size: queries per block (None: the measured defaults, DEFAULT_BLOCK_SIZE and, for the fast path's
            forward, fast.band.FORWARD_BLOCK_SIZE).
        bias: a position bias (zoo/attention/contract.py's ScoreBias), evaluated per block.
        start: the position of key 0 (for the bias: decoding passes the position of its oldest kept key).
        dense: one SDPA call under the (T, S) band mask (backend sdpa, short sequences).
    """
    q_len, k_len = q.shape[2], k.shape[2]
    covers_all = window >= k_len if causal else window // 2 >= k_len - 1
    scores_bias = None
    if bias is not None and (covers_all or need_weights):
        scores_bias = evaluate_bias(bias, q_len, k_len, q.device, start)
    if covers_all:  # the band holds every key: plain (causal) attention
        return dot_product_attention(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p,
            need_weights=need_weights, bias=scores_bias,
        )  # fmt: skip
    if need_weights or dense:
        if bias is not None and scores_bias is None:
            scores_bias = evaluate_bias(bias, q_len, k_len, q.device, start)
        allowed = sliding_window_mask(q_len, k_len, window, causal, q.device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool()[:, None, None, :]
        return masked_attention(q, k, v, allowed, dropout_p, need_weights=need_weights, bias=scores_bias)
    if q_len < k_len:  # decoding a chunk after cached keys: give those keys dummy queries
        q = F.pad(q, (0, 0, k_len - q_len, 0))
    out = _blockwise_sliding_window(
        q, k, v, window, causal, key_padding_mask, dropout_p, block_size or DEFAULT_BLOCK_SIZE, bias, start,
        block_size,
    )  # fmt: skip
    return out[:, :, k_len - q_len :], None
