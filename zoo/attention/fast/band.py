"""Sliding-window attention on the CPU's fused flash kernel, a chunk of query blocks per call (`_ChunkedBand`).

The fast path of zoo/attention/sliding_window.py (same function as its blockwise reference, checked in
tests/attention/test_local_attention.py under both settings of the switch): the forward runs the fused kernel
a chunk of blocks at a time and keeps each query's log-sum-exp, the backward rebuilds each chunk's key windows
and folds their gradients back, so forward+backward memory is O(n) with a constant close to SDPA's instead of
(n / block) x (block + window) keys. Block and chunk sizes were chosen by measurement: re-measure with
`experiments/attention_benchmark.py --rows local local-kernel` (figures in experiments/results/recipes.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from zoo.attention.contract import ScoreBias
from zoo.attention.fast.blocks import fused_kernel_applies
from zoo.attention.functional import additive_mask

# Queries per block in the chunked forward: fewer masked keys per block (block + window) than the backward's
# blocks, and the fused kernel's query tiles are this short anyway; the backward, given the same log-sum-exps,
# keeps the kernel's default blocks, where this size was slower.
FORWARD_BLOCK_SIZE = 32
# Query positions per fused call in the backward: one block. A chunk's temporaries (its key windows'
# gradients) are (block + window) / block times its queries' size, so the smallest chunk holds the least on
# top of the gradients themselves, and the kernel is fastest there (cache-resident); larger chunks measured
# no faster within noise and used more memory.
CHUNK_QUERIES = 64
# The forward holds no gradients: bigger chunks, fewer calls.
FORWARD_CHUNK_QUERIES = 2048

# band(query_positions, key_positions, window, causal) -> bool: the sliding window (zoo/attention/sliding_window.py).
Band = Callable[[torch.Tensor, torch.Tensor, int, bool], torch.Tensor]


def applies(q: torch.Tensor, key_padding_mask, dropout_p: float, bias: ScoreBias | None) -> bool:
    """The chunked path: CPU, no key padding (the chunks are the same for every batch row), and the fused
    kernel's own conditions (no dropout, no learned bias)."""
    return key_padding_mask is None and fused_kernel_applies(q, dropout_p, _requires_grad(bias, q.device))


def chunked_band(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    band: Band,
    window: int,
    causal: bool,
    extent: tuple[int, int],
    block: int,
    forward_block: int | None,
    bias: ScoreBias | None = None,
    start: int = 0,
) -> torch.Tensor:
    """The sliding window of q (B, H, n, D) over k, v (B, G, n, D) -> (B, H, n, D), `extent` keys left and right
    of each query block; the backward blocks the queries by `block`, the forward by `forward_block` (None:
    FORWARD_BLOCK_SIZE). Token i sits at position start + i (for the bias)."""
    length = q.shape[2]
    left, right = extent
    block = min(block, length)
    forward_block = min(forward_block or FORWARD_BLOCK_SIZE, length)
    masks = _chunk_mask_maker(band, length, window, causal, extent, block, bias, start, q.dtype)
    forward_masks = masks
    if forward_block != block:
        forward_masks = _chunk_mask_maker(band, length, window, causal, extent, forward_block, bias, start, q.dtype)
    return _ChunkedBand.apply(q, k, v, (forward_masks, masks), left, right, (forward_block, block))


def chunked_band_with_global_tokens(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    band: Band,
    window: int,
    causal: bool,
    extent: tuple[int, int],
    block: int,
    forward_block: int | None,
    global_tokens: int,
) -> torch.Tensor:
    """The band with Longformer's global tokens (the first g attend to all, all attend to them), q (B, H, n, D)
    over k, v (B, G, n, D) -> (B, H, n, D), as the chunked band above and two small pieces of the keys outside
    the band, merged into its softmax by their log-sum-exps (the keys are disjoint, so the result is the one
    softmax over the union, as blockwise.py's parts):

        columns     the queries g.. over the global keys 0..g-1 outside their band: (n, g)
        rows        the global queries 0..g-1 over every key outside their band (causal: up to themselves): (g, n)
    """
    length = q.shape[2]
    g = min(global_tokens, length)
    left, right = extent
    block = min(block, length)
    forward_block = min(forward_block or FORWARD_BLOCK_SIZE, length)
    masks = _chunk_mask_maker(band, length, window, causal, extent, block, None, 0, q.dtype)
    forward_masks = masks
    if forward_block != block:
        forward_masks = _chunk_mask_maker(band, length, window, causal, extent, forward_block, None, 0, q.dtype)
    outside = functools.partial(_outside_band, band, window, causal)
    # The band is a function of the distance: it holds key 0 (key g - 1) for a prefix of the queries only. From the
    # first query whose band misses key 0 on, every query has a global key outside its band; from the first
    # whose band misses key g - 1 on, all g are outside (no mask).
    queries = torch.arange(g, length)
    first = g + int(band(queries, torch.zeros_like(queries), window, causal).sum())
    clear = g + int(band(queries, torch.full_like(queries, g - 1), window, causal).sum())
    pieces = [_Piece(first, length, g, outside, q.dtype, clear)]
    # A global query has a key outside its band where the band misses key 0 (or, bidirectional, key n - 1).
    global_queries, ends = torch.arange(g), torch.tensor([0, length - 1])
    missed = ~band(global_queries[:, None], ends[None, :], window, causal)
    if (missed[:, 0] | (missed[:, 1] & (not causal))).any():
        pieces.append(_Piece(0, g, length, outside, q.dtype, g))
    pieces = [piece for piece in pieces if piece.start < piece.stop]
    return _ChunkedBandWithPieces.apply(q, k, v, (forward_masks, masks), left, right, (forward_block, block), pieces)


def _outside_band(band: Band, window: int, causal: bool, query_positions, key_positions) -> torch.Tensor:
    """Keys outside the query's band (that a global query or key adds), causal: up to the query."""
    outside = ~band(query_positions, key_positions, window, causal)
    return outside & (key_positions <= query_positions) if causal else outside


class _Piece(NamedTuple):
    """The queries start..stop-1 over the keys 0..keys-1 where `allowed(query_positions, key_positions)`: every
    one of them from the query `clear` on."""

    start: int
    stop: int
    keys: int
    allowed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    dtype: torch.dtype
    clear: int

    def ranges(self, size: int) -> list[tuple[int, int]]:
        """The queries in ranges of at most `size`, those before `clear` (masked) apart from the others."""
        bounds = [(self.start, min(self.clear, self.stop)), (max(self.clear, self.start), self.stop)]
        return [(a, min(a + size, stop)) for start, stop in bounds for a in range(start, stop, size)]

    def mask(self, start: int, stop: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The additive mask (1, 1, stop - start, keys) of the queries start..stop-1, and which have a key (None,
        None: every key is allowed)."""
        if start >= self.clear:
            return None, None
        allowed = self.allowed(torch.arange(start, stop)[:, None], torch.arange(self.keys)[None, :])
        return additive_mask(allowed, self.dtype)[None, None], allowed.any(dim=-1)

    def inputs(self, x: torch.Tensor, row: int, heads: int) -> torch.Tensor:
        """(1, H, keys, D): the piece's keys (or values) of one batch row, each key head repeated for its query
        heads."""
        x = x[row : row + 1, :, : self.keys]
        return x.repeat_interleave(heads // x.shape[1], dim=1) if x.shape[1] != heads else x


def _merge_into(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor, has_key):
    """out (L, H, D) and lse (H, L) in place <- the softmax over their keys and a disjoint part's (part_out
    (1, H, L, D), part_lse (1, H, L)); rows where the part has no key (has_key (L,) False) keep their own."""
    part_lse = part_lse[0] if has_key is None else part_lse[0].masked_fill(~has_key, float("-inf"))
    merged = torch.logaddexp(lse, part_lse)
    out.mul_(torch.exp(lse - merged).T.contiguous()[..., None])
    out.addcmul_(part_out[0].transpose(0, 1), torch.exp(part_lse - merged).T.contiguous()[..., None])
    lse.copy_(merged)


class _ChunkedBandWithPieces(torch.autograd.Function):
    """The chunked band merged with the `pieces` (`_Piece`) by log-sum-exp, FORWARD_CHUNK_QUERIES queries per
    fused call; the backward runs the band's and each piece's fused backward given the merged output and
    log-sum-exp, which yields the gradients of the one joint softmax."""

    @staticmethod
    def forward(ctx, q, k, v, masks, left, right, blocks, pieces):
        out, lse = _band_forward(q, k, v, masks[0], left, right, *blocks)
        heads = q.shape[1]
        for row in range(q.shape[0]):
            for piece in pieces:
                keys, values = piece.inputs(k, row, heads), piece.inputs(v, row, heads)
                for start, stop in piece.ranges(FORWARD_CHUNK_QUERIES):
                    mask, has_key = piece.mask(start, stop)
                    o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                        q[row : row + 1, :, start:stop], keys, values, attn_mask=mask
                    )
                    _merge_into(out[row, start:stop], lse[row, :, start:stop], o, m, has_key)
        ctx.masks, ctx.sizes, ctx.pieces = masks[1], (left, right, blocks[1]), pieces
        ctx.save_for_backward(q, k, v, out, lse)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = _band_backward(q, k, v, out, lse, grad_out, ctx.masks, *ctx.sizes)
        (batch, heads, _, _), groups = q.shape, k.shape[1]
        ranges = [(piece, start, stop) for piece in ctx.pieces for start, stop in piece.ranges(q.shape[2])]
        for piece, start, stop in ranges:
            mask, _ = piece.mask(start, stop)
            for row in range(batch):
                gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    grad_out[row : row + 1, :, start:stop], q[row : row + 1, :, start:stop],
                    piece.inputs(k, row, heads), piece.inputs(v, row, heads),
                    out[row : row + 1, start:stop].transpose(1, 2), lse[row : row + 1, :, start:stop].contiguous(),
                    0.0, False, attn_mask=mask,
                )  # fmt: skip
                grad_q[row, start:stop] += gq[0].transpose(0, 1)
                # A key head's gradient sums over the query heads it serves (grouped-query attention).
                grad_k[row, : piece.keys] += gk[0].unflatten(0, (groups, heads // groups)).sum(1).transpose(0, 1)
                grad_v[row, : piece.keys] += gv[0].unflatten(0, (groups, heads // groups)).sum(1).transpose(0, 1)
        grads = grad_q.transpose(1, 2), grad_k.transpose(1, 2), grad_v.transpose(1, 2)
        return *grads, None, None, None, None, None


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
    of the row, taken once per row (per chunk, the slicing of five tensors cost more than the fused kernel itself
    on small chunks); only a partial last block is copied (zero-padded), and grouped key heads are repeated."""

    def __init__(self, row: int, block: int, heads: int) -> None:
        self.row, self.block, self.heads = row, block, heads

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The whole blocks of x[row] as (n // block, H, block, D), laid out token-major ((block, H, D) in memory,
        as the projections' outputs are: faster in the kernel than head-major blocks)."""
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
    additions (several times faster than aten's general unfold_backward in a profile), no copies."""
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


def _band_forward(q, k, v, masks, left, right, block, backward_block):
    """The chunked forward: out (B, n, H, D) and each query's log-sum-exp (B, H, n padded to whole backward
    blocks; the padded slots +inf, so probability 0 in the backward)."""
    batch, heads, length, dim = q.shape
    out = q.new_empty(batch, length, heads, dim)
    lse = q.new_empty(batch, heads, -(-length // backward_block) * backward_block)
    lse[:, :, length:] = float("inf")
    chunks = _chunks(length, left, right, block, masks, FORWARD_CHUNK_QUERIES)
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
    return out, lse


def _band_backward(q, k, v, out, lse, grad_out, masks, left, right, block):
    """The chunked backward given the output (B, n, H, D) and log-sum-exp of the whole softmax (the band's own, or
    merged with other keys': then these are the band's share of the joint softmax's gradients) -> the gradients of
    q (B, n, H, D), k and v (B, n, G, D)."""
    batch, heads, length, dim = q.shape
    groups = k.shape[1]
    grad_q = q.new_empty(batch, length, heads, dim)
    grad_k, grad_v = k.new_zeros(batch, length, groups, dim), v.new_zeros(batch, length, groups, dim)
    out, grad_q_heads = out.transpose(1, 2), grad_q.transpose(1, 2)
    chunks = _chunks(length, left, right, block, masks, CHUNK_QUERIES)
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
    return grad_q, grad_k, grad_v


class _ChunkedBand(torch.autograd.Function):
    """The blockwise band on the fused CPU kernel, a chunk of queries of one sequence per call (FORWARD_CHUNK_QUERIES
    in the forward, CHUNK_QUERIES in the backward); the backward rebuilds each chunk's key windows and folds their
    gradients back, so no tensor of (n / block) * (block + window) keys is ever held: O(n) memory, as SDPA's.
    Every query attends to the same keys whatever its block, so the forward and the backward may block the
    queries differently (`blocks`: the forward's block, the backward's): the backward gets each query's
    log-sum-exp. `masks`: the forward's and the backward's makers (`_chunk_mask_maker`)."""

    @staticmethod
    def forward(ctx, q, k, v, masks, left, right, blocks):
        out, lse = _band_forward(q, k, v, masks[0], left, right, *blocks)
        ctx.masks, ctx.sizes = masks[1], (left, right, blocks[1])
        ctx.save_for_backward(q, k, v, out, lse)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = _band_backward(q, k, v, out, lse, grad_out, ctx.masks, *ctx.sizes)
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
    band: Band,
    length: int,
    window: int,
    causal: bool,
    extent: tuple[int, int],
    block: int,
    bias: ScoreBias | None,
    start_position: int,
    dtype,
):
    """masks(start, n_blocks, key_start, span) for `_ChunkedBand`: the band over each block's `span` keys (block i
    of the chunk sees keys key_start + i * block on): away from the sequence's ends one (block, span) mask
    broadcast over the blocks; at the ends a block's clipped window takes a slice of it (copied per call, freed
    after it), and the partial last block its own mask, where query slots past the end see every key (their
    outputs are dropped); the bias added."""
    left, right = extent
    inference = torch.is_inference_mode_enabled()

    def masks(start: int, n_blocks: int, key_start: int, span: int) -> torch.Tensor:
        interior = _interior_band_mask(band, window, causal, left, right, block, dtype, inference)
        offset = key_start - (start - left)  # the band depends on key - query only: an end block's clipped
        if start + block <= length and offset >= 0 and offset + span <= interior.shape[-1]:  # window is a slice
            mask = interior[..., offset : offset + span].contiguous()
        else:  # the partial last block, whose slots past the end see every key
            mask = _end_band_mask(band, window, causal, block, start, key_start, span, length, dtype)
        if bias is not None:
            first = block * torch.arange(n_blocks)[:, None]  # (nbc, 1)
            query_positions = start_position + start + first + torch.arange(block)
            key_positions = start_position + key_start + first + torch.arange(span)
            mask = mask + bias(query_positions, key_positions).to(dtype)
        return mask

    return masks


@functools.lru_cache(maxsize=4)
def _interior_band_mask(band: Band, window: int, causal: bool, left: int, right: int, block: int, dtype, inference):
    """(1, 1, block, left + block + right) additive band of every block away from the sequence's ends (query i
    of a block sits `left` positions after its window's first key). Inference-mode tensors are kept apart
    (autograd cannot save them)."""
    del inference  # part of the cache key only
    queries = left + torch.arange(block)[:, None]
    allowed = band(queries, torch.arange(left + block + right)[None, :], window, causal)
    return additive_mask(allowed, dtype)[None, None]


def _end_band_mask(
    band: Band, window: int, causal: bool, block: int, start: int, key_start: int, span: int, length: int, dtype
) -> torch.Tensor:
    """(1, 1, block, span) additive band of the one block of queries from `start` over keys key_start.. (inside
    the sequence); query slots past its end see every key instead (their outputs are dropped). Not cached
    (cheap to build, for the one partial block of a call): a cache would hold its mask through the backward."""
    queries = start + torch.arange(block)[:, None]
    allowed = band(queries, key_start + torch.arange(span)[None, :], window, causal)
    allowed = allowed | (queries >= length)
    return additive_mask(allowed, dtype)[None, None]
