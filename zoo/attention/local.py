"""Sliding-window (local) attention: each query sees only the keys within `window` positions.

Causal: the previous `window` positions including itself; bidirectional: `window // 2` on each side
(the local band of Longformer, Beltagy et al. 2020; the sliding window of Mistral, Jiang et al. 2023).
Exactly full softmax attention under the banded mask, computed blockwise in O(n * window) time and
memory: no (n, n) tensor is ever allocated. A position bias (zoo/attention/contract.py) is evaluated per
query block, for that block's keys only; grouped key/value heads stay grouped (SDPA's enable_gqa). On the
CPU without key padding, dropout or a learned bias, the blocks go through the fused kernel a chunk at a time
and the backward rebuilds each chunk's key windows (`_ChunkedBand`): forward+backward memory is O(n) with
a constant close to SDPA's, not (n / block) x (block + window) keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from zoo.attention.blockwise import DENSE_MAX_LENGTH, blocked_windows, fused_kernel_applies
from zoo.attention.cache import RollingKVCache, new_tokens_padding
from zoo.attention.contract import Kernel, ScoreBias
from zoo.attention.flex import flex_pattern_attention, resolve_backend
from zoo.attention.functional import additive_mask, dot_product_attention, evaluate_bias, masked_attention, sdpa
from zoo.attention.sinks import SinkKVCache, sliding_window_attention_with_sinks
from zoo.errors import check_positive_int

# Queries per block, chosen by measurement (experiments/results/recipes.md):
# the fused backward zero-fills key/value gradients of size (n / block) * (block + window), so neither
# small nor large blocks win.
DEFAULT_BLOCK_SIZE = 64
# The forward's blocks on the chunked path: fewer masked keys per block (block + window) than 64, and the fused
# kernel's query tiles are 32 long anyway for short blocks (n=8192, window 256: 7% faster than 64; the backward,
# given the same log-sum-exps, keeps 64, where 32 measured 2-7% slower).
FORWARD_BLOCK_SIZE = 32
# Query positions per call of the fused kernel in the chunked path's backward (`_ChunkedBand`): one block. A chunk's
# temporaries (its key windows' gradients) are (block + window) / block times its queries' size, so the smallest
# chunk holds the least on top of the gradients themselves; the kernel is also fastest there (cache-resident).
# Measured at n=8192, window 256, forward+backward of the module, 1 thread: peak 65.0 MiB at 64 (full's 65.1; the
# benchmark's run beside the test suite: 65.2), 65.7 at 128, 69.8 at 512; the kernel's time at 1 thread 234 ms at
# 64, 270 at 512 (32768, 2 threads: 799 vs 971). At 2 threads, n=8192, 64/128/192/256 measured 110/115/107/116 ms
# (kernel forward+backward, within this machine's noise) and 65.0/65.7/66.4/67.0 MiB (module): 64 stays.
CHUNK_QUERIES = 64
# The forward holds no gradients: bigger chunks, fewer calls (n=8192: 7-10% faster than 512).
FORWARD_CHUNK_QUERIES = 2048


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


def _band_extent(window: int, causal: bool, length: int) -> tuple[int, int]:
    """Keys taken left and right of a query block, clipped to the sequence (farther keys do not exist).

    Causal takes `window` keys on the left although the farthest is always masked: blocks of
    block + window keys measured faster in the fused kernel than block + window - 1.
    """
    if causal:
        return min(window, length - 1), 0
    half = min(window // 2, length - 1)
    return half, half


def _block_band(
    window: int, causal: bool, left: int, right: int, block: int, device: torch.device | None = None
) -> torch.Tensor:
    """(block, left + block + right) bool: the band for a block's queries over its window of keys (the same for
    every block; query i of the block sits `left` positions after the window's first key)."""
    queries = left + torch.arange(block, device=device)[:, None]
    return band(queries, torch.arange(left + block + right, device=device)[None, :], window, causal)


def _block_allowed(
    batch: int,
    length: int,
    window: int,
    causal: bool,
    block: int,
    key_padding_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """(B * n_blocks, block, keys) bool: the band, restricted to real keys of the block's own sequence."""
    n_blocks = -(-length // block)
    padded = n_blocks * block
    left, right = _band_extent(window, causal, length)
    # Which sequence each flat key belongs to; -1 for padding (added here or by key_padding_mask).
    owner = torch.full((left + batch * padded + right,), -1, dtype=torch.long, device=device)
    body = owner[left : left + batch * padded].view(batch, padded)[:, :length]
    body.copy_(torch.arange(batch, device=device)[:, None].expand(batch, length))
    if key_padding_mask is not None:
        body.masked_fill_(key_padding_mask.bool(), -1)
    block_owner = torch.arange(batch, device=device).repeat_interleave(n_blocks)
    real_key = owner.unfold(0, left + block + right, block) == block_owner[:, None]  # (B * n_blocks, keys)
    return _block_band(window, causal, left, right, block, device) & real_key[:, None, :]


@functools.lru_cache(maxsize=4)
def _cached_block_mask(
    batch: int,
    length: int,
    window: int,
    causal: bool,
    block: int,
    device: torch.device,
    dtype: torch.dtype,
    inference: bool,
) -> torch.Tensor:
    """Additive mask of all blocks without padding (training repeats shapes); inference-mode tensors
    are kept apart because autograd cannot save them."""
    del inference  # part of the cache key only
    allowed = _block_allowed(batch, length, window, causal, block, None, device)
    # Query rows past the end of the sequence may see no key at all; let them see every key of the
    # block instead of producing NaN (their outputs are dropped).
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return additive_mask(allowed, dtype)[:, None]


def _blockwise_sliding_window(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
    block: int,
    bias: ScoreBias | None = None,
    start: int = 0,
    forward_block: int | None = None,
) -> torch.Tensor:
    """Query blocks folded into the batch dimension, so one 4-D SDPA call runs the fused CPU kernel
    (5-D inputs would fall back to the slow math path); each block attends to its block + window keys.
    Token i sits at position start + i (for the bias). Without key padding, dropout or a learned bias, on the
    CPU: `_ChunkedBand`, blocks a chunk at a time (the forward's of `forward_block` queries, default `block`)."""
    batch, heads, length, dim = q.shape
    block = min(block, length)
    if (
        key_padding_mask is None
        and q.device.type == "cpu"
        and fused_kernel_applies(q, dropout_p, _requires_grad(bias, q.device))
    ):
        left, right = _band_extent(window, causal, length)
        forward_block = min(forward_block or block, length)
        masks = _chunk_mask_maker(length, window, causal, block, bias, start, q.dtype)
        forward_masks = masks
        if forward_block != block:
            forward_masks = _chunk_mask_maker(length, window, causal, forward_block, bias, start, q.dtype)
        return _ChunkedBand.apply(q, k, v, (forward_masks, masks), left, right, (forward_block, block))
    n_blocks = -(-length // block)
    padded = n_blocks * block
    left, right = _band_extent(window, causal, length)
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


class _Chunk(NamedTuple):
    """Query blocks first..last-1 (tokens start..stop-1) and their key windows: `keys` rows from `key_start`, each
    block's window `span` long (a block every `block` rows); `masks` makes their additive mask (`mask()`), built
    when the chunk runs so that at most one end block's mask is alive at a time. Interior chunks' windows are all
    left + block + right long and inside the sequence; the others (at the ends) are one block each."""

    first: int
    last: int
    start: int
    stop: int
    key_start: int
    keys: int
    span: int
    interior: bool
    masks: Callable[[int, int, int, int], torch.Tensor]

    def mask(self) -> torch.Tensor:
        return self.masks(self.start, self.last - self.first, self.key_start, self.span)


class _Row:
    """One batch row of the chunked band's tensors (B, H, n, D), cut into the kernel's blocks. Whole blocks are views
    of the row, taken once per row (per chunk, the slicing of five tensors cost more than the fused kernel at 64
    queries a call); only a partial last block is copied (zero-padded), and grouped key heads are repeated."""

    def __init__(self, row: int, block: int, heads: int) -> None:
        self.row, self.block, self.heads = row, block, heads

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The whole blocks of x[row] as (n // block, H, block, D), laid out token-major ((block, H, D) in memory,
        as the projections' outputs are: measured 1.3x faster in the kernel than head-major blocks)."""
        tokens = x[self.row].transpose(0, 1)
        whole = tokens.shape[0] // self.block
        return tokens[: whole * self.block].unflatten(0, (whole, self.block)).transpose(1, 2)

    def queries(self, x: torch.Tensor, blocks: torch.Tensor, chunk: _Chunk) -> torch.Tensor:
        """The chunk's query blocks (nbc, H, block, D) of x, given `blocks(x)`; a partial last block zero-padded."""
        if chunk.last <= blocks.shape[0]:
            return blocks[chunk.first : chunk.last]
        tokens = F.pad(x[self.row, :, chunk.start : chunk.stop], (0, 0, 0, self.block - (chunk.stop - chunk.start)))
        return tokens[None]

    def windows(self, x: torch.Tensor, interior: _Chunk | None) -> torch.Tensor | None:
        """The key windows of x (B, G, n, D) of every block from the first interior chunk `interior` on, as
        (count, G, span, D) views; None without interior chunks."""
        if interior is None:
            return None
        rows = x[self.row, :, interior.key_start :].transpose(0, 1)  # (keys, G, D)
        return rows.unfold(0, interior.span, self.block).transpose(-1, -2)

    def chunk_windows(self, x: torch.Tensor, windows: torch.Tensor | None, offset: int, chunk: _Chunk):
        """The chunk's key windows (nbc, H, span, D) of x (B, G, n, D): from `windows` (block `offset` first) for
        an interior chunk, else cut from the row; each of the G key heads repeated for its H // G query heads."""
        if chunk.interior:
            keys = windows[chunk.first - offset : chunk.last - offset]
        else:
            rows = x[self.row, :, chunk.key_start : chunk.key_start + chunk.keys].transpose(0, 1)
            keys = rows.unfold(0, chunk.span, self.block).transpose(-1, -2)
        groups = keys.shape[1]
        if groups != self.heads:  # grouped-query attention
            keys = keys.repeat_interleave(self.heads // groups, dim=1)
        return keys


def _add_window_grads(total: torch.Tensor, grad: torch.Tensor, first: int, block: int) -> None:
    """total (n, G, D) += the gradient of key windows (nbc, H, span, D) whose window i starts at key position
    first + i * block (all inside 0..n-1). Windows of whole blocks add piece by piece, as views: a few shifted
    additions (profile at n=8192, 1 thread: aten's unfold_backward took 59 ms a step, these 8 ms), no copies."""
    n_blocks, heads, span, dim = grad.shape
    groups = total.shape[1]
    if groups != heads:  # grouped-query attention: a key head's gradient sums over the heads it serves
        grad = grad.unflatten(1, (groups, heads // groups)).sum(dim=2)
    if n_blocks == 1:
        total[first : first + span] += grad[0].transpose(0, 1)
    elif span % block:
        rows = (n_blocks - 1) * block + span
        total[first : first + rows] += torch.ops.aten.unfold_backward(
            grad.transpose(-1, -2), [rows, groups, dim], 0, span, block
        )
    else:  # piece p of every window: rows first + p * block on, (nbc, block, G, D)
        for p in range(span // block):
            rows = total[first + p * block : first + (p + n_blocks) * block].view(n_blocks, block, groups, dim)
            rows += grad[:, :, p * block : (p + 1) * block].transpose(1, 2)


class _ChunkedBand(torch.autograd.Function):
    """The blockwise band on the fused CPU kernel, a chunk of queries of one sequence per call (FORWARD_CHUNK_QUERIES
    in the forward, CHUNK_QUERIES in the backward); the backward rebuilds each chunk's key windows and folds their
    gradients back, so no tensor of (n / block) * (block + window) keys is ever held: O(n) memory, as SDPA's.
    Every query attends to the same keys whatever its block, so the forward and the backward may block the
    queries differently (`blocks`: the forward's block, the backward's): the backward gets each query's
    log-sum-exp. `masks`: the forward's and the backward's makers (`_chunk_mask_maker`)."""

    @staticmethod
    def forward(ctx, q, k, v, masks, left, right, blocks):
        batch, heads, length, dim = q.shape
        (block, backward_block), (forward_masks, _) = blocks, masks
        out = q.new_empty(batch, length, heads, dim)
        lse = q.new_empty(batch, heads, -(-length // backward_block) * backward_block)
        # The backward's padded query slots: log-sum-exp +inf, so probability 0 (their gradients are dropped).
        lse[:, :, length:] = float("inf")
        chunks = _chunks(length, left, right, block, forward_masks, FORWARD_CHUNK_QUERIES)
        interior = next((chunk for chunk in chunks if chunk.interior), None)
        offset = interior.first if interior is not None else 0
        for row in range(batch):
            at = _Row(row, block, heads)
            q_blocks, k_windows, v_windows = at.blocks(q), at.windows(k, interior), at.windows(v, interior)
            for chunk in chunks:
                o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    at.queries(q, q_blocks, chunk), at.chunk_windows(k, k_windows, offset, chunk),
                    at.chunk_windows(v, v_windows, offset, chunk), attn_mask=chunk.mask(),
                )  # fmt: skip
                tokens = chunk.stop - chunk.start
                out[row, chunk.start : chunk.stop] = o.transpose(1, 2).reshape(-1, heads, dim)[:tokens]
                lse[row, :, chunk.start : chunk.stop] = m.transpose(0, 1).reshape(heads, -1)[:, :tokens]
        ctx.masks, ctx.sizes = masks[1], (left, right, backward_block)
        ctx.save_for_backward(q, k, v, out, lse)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        (left, right, block), (batch, heads, length, dim) = ctx.sizes, q.shape
        groups = k.shape[1]
        grad_q = q.new_empty(batch, length, heads, dim)
        grad_k, grad_v = k.new_zeros(batch, length, groups, dim), v.new_zeros(batch, length, groups, dim)
        out, grad_q_heads = out.transpose(1, 2), grad_q.transpose(1, 2)
        chunks = _chunks(length, left, right, block, ctx.masks, CHUNK_QUERIES)
        interior = next((chunk for chunk in chunks if chunk.interior), None)
        offset = interior.first if interior is not None else 0
        for row in range(batch):
            at = _Row(row, block, heads)
            q_blocks, grad_blocks, out_blocks, grad_q_blocks = map(at.blocks, (q, grad_out, out, grad_q_heads))
            k_windows, v_windows = at.windows(k, interior), at.windows(v, interior)
            lse_blocks = lse[row].unflatten(1, (-1, block)).transpose(0, 1)  # (blocks, H, block), a view
            for chunk in chunks:
                gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    at.queries(grad_out, grad_blocks, chunk), at.queries(q, q_blocks, chunk),
                    at.chunk_windows(k, k_windows, offset, chunk), at.chunk_windows(v, v_windows, offset, chunk),
                    at.queries(out, out_blocks, chunk), lse_blocks[chunk.first : chunk.last].contiguous(), 0.0, False,
                    attn_mask=chunk.mask(),
                )  # fmt: skip
                if chunk.last <= grad_q_blocks.shape[0]:
                    grad_q_blocks[chunk.first : chunk.last] = gq
                else:  # the partial last block
                    grad_q_heads[row, :, chunk.start : chunk.stop] = gq[0, :, : chunk.stop - chunk.start]
                _add_window_grads(grad_k[row], gk, chunk.key_start, block)
                _add_window_grads(grad_v[row], gv, chunk.key_start, block)
                del gq, gk, gv  # before the next chunk's are allocated: the peak holds one chunk's, not two
        return grad_q.transpose(1, 2), grad_k.transpose(1, 2), grad_v.transpose(1, 2), None, None, None, None


def _chunks(length: int, left: int, right: int, block: int, masks, queries: int) -> list[_Chunk]:
    """The chunks of about `queries` queries (whole blocks), the same for every batch row (no key padding on this
    path). The blocks whose key windows would reach outside the sequence (the first ceil(left / block); those within
    block + right of the end) are chunks of one block each, their windows clipped to the sequence (no zero-padded
    copy of the keys, a smaller gradient of them): the others have windows of left + block + right keys and share
    one broadcast mask."""
    n_blocks = -(-length // block)
    head = min(-(-left // block), n_blocks)
    tail = max(head, min(n_blocks, (length - right) // block))
    step = max(1, queries // block)
    bounds = [*range(head), *range(head, tail, step), *range(tail, n_blocks + 1)]
    chunks = []
    for first, last in zip(bounds, bounds[1:]):
        start, stop = first * block, min(last * block, length)
        key_start, key_stop = start - left, last * block + right
        interior = head <= first and last <= tail
        if not interior:  # one block at an end: its window clipped to the sequence
            key_start, key_stop = max(key_start, 0), min(key_stop, length)
        keys = key_stop - key_start
        span = keys - (last - first - 1) * block
        chunks.append(_Chunk(first, last, start, stop, key_start, keys, span, interior, masks))
    return chunks


def _requires_grad(bias: ScoreBias | None, device: torch.device) -> bool:
    """Whether a bias is learned and being trained (the fused kernel gives no bias gradient)."""
    if bias is None or not torch.is_grad_enabled():
        return False
    probe = torch.zeros(1, 1, dtype=torch.long, device=device)
    return bias(probe, probe).requires_grad


def _chunk_mask_maker(
    length: int, window: int, causal: bool, block: int, bias: ScoreBias | None, start_position: int, dtype
):
    """masks(start, n_blocks, key_start, span) for `_ChunkedBand`: the band over each block's `span` keys (block i
    of the chunk sees keys key_start + i * block on): away from the sequence's ends one (block, span) mask
    broadcast over the blocks; at the ends a block's clipped window takes a slice of it (copied per call, freed
    after it), and the partial last block its own mask, where query slots past the end see every key (their
    outputs are dropped); the bias added."""
    left, right = _band_extent(window, causal, length)
    inference = torch.is_inference_mode_enabled()

    def masks(start: int, n_blocks: int, key_start: int, span: int) -> torch.Tensor:
        interior = _interior_band_mask(window, causal, left, right, block, dtype, inference)
        offset = key_start - (start - left)  # the band depends on key - query only: an end block's clipped
        if start + block <= length and offset >= 0 and offset + span <= interior.shape[-1]:  # window is a slice
            mask = interior[..., offset : offset + span].contiguous()
        else:  # the partial last block, whose slots past the end see every key
            mask = _end_band_mask(window, causal, block, start, key_start, span, length, dtype)
        if bias is not None:
            first = block * torch.arange(n_blocks)[:, None]  # (nbc, 1)
            query_positions = start_position + start + first + torch.arange(block)
            key_positions = start_position + key_start + first + torch.arange(span)
            mask = mask + bias(query_positions, key_positions).to(dtype)
        return mask

    return masks


@functools.lru_cache(maxsize=4)
def _interior_band_mask(window: int, causal: bool, left: int, right: int, block: int, dtype, inference: bool):
    """(1, 1, block, left + block + right) additive band of every block away from the sequence's ends.
    Inference-mode tensors are kept apart (autograd cannot save them)."""
    del inference  # part of the cache key only
    return additive_mask(_block_band(window, causal, left, right, block), dtype)[None, None]


def _end_band_mask(
    window: int, causal: bool, block: int, start: int, key_start: int, span: int, length: int, dtype
) -> torch.Tensor:
    """(1, 1, block, span) additive band of the one block of queries from `start` over keys key_start.. (inside
    the sequence); query slots past its end see every key instead (their outputs are dropped). Not cached (~0.07
    ms to build, for the one partial block of a call): a cache would hold its mask through the backward."""
    queries = start + torch.arange(block)[:, None]
    allowed = band(queries, key_start + torch.arange(span)[None, :], window, causal)
    allowed = allowed | (queries >= length)
    return additive_mask(allowed, dtype)[None, None]


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
    """q (B, H, T, D), k/v (B, G, S, D), T <= S with the queries at the last T positions; key j sits at
    position start + j (for the bias: decoding passes the position of its oldest kept key). block_size: queries
    per block (None: the measured defaults, DEFAULT_BLOCK_SIZE and, for the chunked path's forward,
    FORWARD_BLOCK_SIZE).

    need_weights (and `dense`: backend sdpa) computes under the (T, S) band mask in one call: O(T S)
    memory, for small inputs.
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
        block_size or FORWARD_BLOCK_SIZE,
    )  # fmt: skip
    return out[:, :, k_len - q_len :], None


class LocalAttention(Kernel):
    """Sliding-window attention with a rolling cache of `window` keys for decoding.

    Options: `window` (keys per query), `chunk_size` (query block length of the blockwise kernel; None:
    the measured defaults, 32 in the CPU's chunked forward and 64 elsewhere), `sink_tokens` (causal: every query
    also sees the first s tokens, which the rolling cache keeps; StreamingLLM's attention sinks, zoo/attention/
    sinks.py; 0: none). Backends (attention.backend):
    blockwise (the CPU's auto; up to DENSE_MAX_LENGTH keys, as the pattern kernels, the dense band mask), flex
    (CUDA's auto; zoo/attention/flex.py), sdpa (one SDPA call under the dense band mask).
    """

    name = "local"
    supports_cross_attention = False
    supports_position_bias = True
    backends = ("blockwise", "flex", "sdpa")

    def __init__(self, *, window: int = 256, chunk_size: int | None = None, sink_tokens: int = 0) -> None:
        super().__init__()
        check_positive_int("attention.window (variant 'local')", window)
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
            raise ValueError(f"attention.sink_tokens must be an int >= 0 (0: no attention sinks), got {sink_tokens!r}")
        self.window = window
        self.chunk_size = chunk_size  # None: the measured defaults
        self.sink_tokens = sink_tokens

    def notice(self) -> str | None:
        """A window that reaches every token of the model's sequences both ways (window // 2 >= length - 1: the
        bidirectional band; a causal one needs only window >= length) is exactly full attention there."""
        length = getattr(self, "layout", None) and self.layout.max_length
        if not length or self.window // 2 < length - 1:
            return None
        return (
            f"attention.window={self.window} covers all {length} tokens of this model's sequences: local attention "
            f"is exactly full attention here; set attention.window below {length} for a sliding window"
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        bias: ScoreBias | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.sink_tokens:
            self._check_sinks(causal, bias)
            return sliding_window_attention_with_sinks(
                q, k, v, self.window, self.sink_tokens, key_padding_mask=key_padding_mask, dropout_p=dropout_p,
                need_weights=need_weights,
            )  # fmt: skip
        backend = resolve_backend(self.name, self.backend, q, k, dropout_p, bias, need_weights)
        if backend == "flex":
            pattern = functools.partial(band, window=self.window, causal=causal)
            out = flex_pattern_attention(q, k, v, pattern, self._flex_masks, (causal,), key_padding_mask)
            return out, None
        # Up to DENSE_MAX_LENGTH keys one fused call under the band mask, as the pattern kernels: below it the
        # blocks' fixed costs exceed the work they save (forward+backward, 2 threads: 0.24x of the blockwise time
        # at n=17, 0.52x at 64, 0.60-0.71x at 256; at 512 0.69x-1.17x by the window, at 1024 1.3-2.3x).
        dense = backend == "sdpa" or k.shape[2] <= DENSE_MAX_LENGTH
        return sliding_window_attention(
            q, k, v, self.window, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p,
            need_weights=need_weights, block_size=self.chunk_size, bias=bias, dense=dense,
        )  # fmt: skip

    def _check_sinks(self, causal: bool, bias: ScoreBias | None) -> None:
        if not causal or bias is not None:
            raise ValueError(
                f"attention.sink_tokens={self.sink_tokens} keeps the first tokens of a causal window without a "
                f"position bias; this attention is causal={causal}, position_bias={'set' if bias is not None else None}"
            )

    def new_cache(self) -> RollingKVCache | SinkKVCache:
        return SinkKVCache(self.window, self.sink_tokens) if self.sink_tokens else RollingKVCache(self.window)

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: RollingKVCache,
        *,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        bias: ScoreBias | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal: new queries (B, H, t, D) see the last window - 1 cached keys and themselves.

        Weights, if asked, cover the attended keys only: (B, H, t, kept + t).
        """
        if self.sink_tokens:
            self._check_sinks(True, bias)
            keys, values, positions, padding = cache.extend(k, v, new_tokens_padding(key_padding_mask, k.shape[2]))
            return sliding_window_attention_with_sinks(
                q, keys, values, self.window, self.sink_tokens, positions, padding, need_weights=need_weights
            )
        keys, values, padding = cache.extend(k, v, new_tokens_padding(key_padding_mask, k.shape[2]))
        return sliding_window_attention(
            q, keys, values, self.window, causal=True, key_padding_mask=padding,
            need_weights=need_weights, block_size=self.chunk_size, bias=bias, start=cache.offset - keys.shape[2],
        )  # fmt: skip
