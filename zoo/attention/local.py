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

import torch
import torch.nn.functional as F

from zoo.attention.blockwise import blocked_windows, fused_kernel_applies
from zoo.attention.cache import RollingKVCache, new_tokens_padding
from zoo.attention.contract import Kernel, ScoreBias
from zoo.attention.flex import flex_pattern_attention, resolve_backend
from zoo.attention.functional import additive_mask, dot_product_attention, evaluate_bias, masked_attention, sdpa
from zoo.errors import check_positive_int

# Queries per block, chosen by measurement (experiments/results/recipes.md):
# the fused backward zero-fills key/value gradients of size (n / block) * (block + window), so neither
# small nor large blocks win.
DEFAULT_BLOCK_SIZE = 64
# The forward's blocks on the chunked path: fewer masked keys per block (block + window) than 64, and the fused
# kernel's query tiles are 32 long anyway for short blocks (n=8192, window 256: 7% faster than 64; the backward,
# given the same log-sum-exps, keeps 64, where 32 measured 2-7% slower).
FORWARD_BLOCK_SIZE = 32
# Query positions per call of the fused kernel on the chunked path (`_ChunkedBand`): its temporaries (a chunk's
# key windows and their gradients, a few MiB) are reused by the allocator, where whole-sequence ones are
# page-faulted in afresh every step (profile at n=8192: a third of forward+backward was zero-filling them).
# Measured at n=8192, window 256: forward+backward peak 48.6 MiB at 512 (SDPA's: 48.0), 59 at 1024, 85 at 2048,
# the same time from 256 to 1024.
CHUNK_QUERIES = 512
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


def _chunk_queries(x: torch.Tensor, row: int, start: int, stop: int, block: int) -> torch.Tensor:
    """Tokens start..stop-1 of batch row `row` of x (B, H, n, D) as query blocks (nbc, H, block, D), the last
    one zero-padded, laid out token-major ((nbc, block, H, D) in memory, as the keys and the projections'
    outputs are): a view where x is so already (measured 1.3x faster in the kernel than head-major blocks)."""
    chunk = x[row, :, start:stop].transpose(0, 1)  # (tokens, H, D)
    missing = -(stop - start) % block
    if missing:
        chunk = F.pad(chunk, (0, 0, 0, 0, 0, missing))
    length, heads, dim = chunk.shape
    return chunk.reshape(length // block, block, heads, dim).transpose(1, 2)


def _chunk_windows(x: torch.Tensor, row: int, start: int, rows: int, heads: int) -> torch.Tensor:
    """Keys start..start+rows-1 of batch row `row` of x (B, G, n, D), zero outside 0..n-1, as (rows, heads, D)
    with each of the G key heads repeated for its heads // G query heads (grouped-query attention)."""
    _, groups, length, dim = x.shape
    if groups == heads and start >= 0 and start + rows <= length:  # inside the sequence: a view (8% faster)
        return x[row, :, start : start + rows].transpose(0, 1)
    buffer = x.new_empty(rows, groups, heads // groups, dim)
    low, high = max(start, 0), min(start + rows, length)
    buffer[: low - start].zero_()
    buffer[high - start :].zero_()
    buffer[low - start : high - start] = x[row, :, low:high].transpose(0, 1)[:, :, None]
    return buffer.view(rows, heads, dim)


def _add_window_grads(total: torch.Tensor, grad: torch.Tensor, first: int, block: int) -> None:
    """total (n, G, D) += the gradient of key windows (nbc, H, keys, D) whose window i starts at key position
    first + i * block (positions outside 0..n-1 are dropped). Windows of whole blocks add piece by piece: a few
    shifted additions (profile at n=8192, 1 thread: aten's unfold_backward took 59 ms a step, these 8 ms)."""
    n_blocks, heads, keys, dim = grad.shape
    groups, length = total.shape[1], total.shape[0]
    if keys % block:
        rows = (n_blocks - 1) * block + keys
        grad = torch.ops.aten.unfold_backward(grad.transpose(-1, -2), [rows, heads, dim], 0, keys, block)
        pieces = [(first, grad)]
    else:
        pieces = []
        for piece in range(keys // block):
            chunk = grad[:, :, piece * block : (piece + 1) * block].transpose(1, 2).reshape(-1, heads, dim)
            pieces.append((first + piece * block, chunk))
    for start, chunk in pieces:
        if groups != heads:  # grouped-query attention: a key head's gradient sums over the heads it serves
            chunk = chunk.view(chunk.shape[0], groups, heads // groups, dim).sum(dim=2)
        low, high = max(start, 0), min(start + chunk.shape[0], length)
        if low < high:
            total[low:high] += chunk[low - start : high - start]


class _ChunkedBand(torch.autograd.Function):
    """The blockwise band on the fused CPU kernel, a chunk of queries of one sequence per call (FORWARD_CHUNK_QUERIES
    in the forward, CHUNK_QUERIES in the backward); the backward rebuilds each chunk's key windows and folds their
    gradients back, so no tensor of (n / block) * (block + window) keys is ever held: O(n) memory, as SDPA's.
    Every query attends to the same keys whatever its block, so the forward and the backward may block the
    queries differently (`blocks`: the forward's block, the backward's): the backward gets each query's
    log-sum-exp. `masks`: the forward's and the backward's makers, `masks(start, n_blocks)` a chunk's additive
    mask (broadcastable to (nbc, H, block, keys))."""

    @staticmethod
    def forward(ctx, q, k, v, masks, left, right, blocks):
        batch, heads, length, dim = q.shape
        (block, backward_block), (forward_masks, _) = blocks, masks
        out = q.new_empty(batch, length, heads, dim)
        lse = q.new_empty(batch, heads, -(-length // backward_block) * backward_block)
        # The backward's padded query slots: log-sum-exp +inf, so probability 0 (their gradients are dropped).
        lse[:, :, length:] = float("inf")
        window = left + block + right
        for row, start, stop, keys, mask in _chunks(
            batch, length, left, right, block, forward_masks, FORWARD_CHUNK_QUERIES
        ):
            k_blocks = _chunk_windows(k, row, start - left, keys, heads).unfold(0, window, block).transpose(-1, -2)
            v_blocks = _chunk_windows(v, row, start - left, keys, heads).unfold(0, window, block).transpose(-1, -2)
            queries = _chunk_queries(q, row, start, stop, block)
            o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                queries, k_blocks, v_blocks, attn_mask=mask
            )
            out[row, start:stop] = o.transpose(1, 2).reshape(-1, heads, dim)[: stop - start]
            lse[row, :, start:stop] = m.transpose(0, 1).reshape(heads, -1)[:, : stop - start]
        ctx.masks, ctx.sizes = masks[1], (left, right, backward_block)
        ctx.save_for_backward(q, k, v, out, lse)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        (left, right, block), (batch, heads, length, dim) = ctx.sizes, q.shape
        groups, window = k.shape[1], left + block + right
        grad_q = q.new_empty(batch, length, heads, dim)
        grad_k, grad_v = k.new_zeros(batch, length, groups, dim), v.new_zeros(batch, length, groups, dim)
        out = out.transpose(1, 2)
        for row, start, stop, keys, mask in _chunks(batch, length, left, right, block, ctx.masks, CHUNK_QUERIES):
            k_blocks = _chunk_windows(k, row, start - left, keys, heads).unfold(0, window, block).transpose(-1, -2)
            v_blocks = _chunk_windows(v, row, start - left, keys, heads).unfold(0, window, block).transpose(-1, -2)
            slots = lse[row, :, start : start + k_blocks.shape[0] * block]
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                _chunk_queries(grad_out, row, start, stop, block), _chunk_queries(q, row, start, stop, block),
                k_blocks, v_blocks, _chunk_queries(out, row, start, stop, block),
                slots.view(heads, -1, block).transpose(0, 1).contiguous(), 0.0, False, attn_mask=mask,
            )  # fmt: skip
            grad_q[row, start:stop] = gq.transpose(1, 2).reshape(-1, heads, dim)[: stop - start]
            _add_window_grads(grad_k[row], gk, start - left, block)
            _add_window_grads(grad_v[row], gv, start - left, block)
        return grad_q.transpose(1, 2), grad_k.transpose(1, 2), grad_v.transpose(1, 2), None, None, None, None


def _chunks(batch: int, length: int, left: int, right: int, block: int, masks, queries: int):
    """(row, start, stop, key rows, mask) of every chunk of about `queries` queries (whole blocks); the batch rows
    of a chunk share its mask (no key padding on this path). The blocks whose key windows reach outside the
    sequence (the first ceil(left / block); those within block + right of the end) are chunks of their own, so
    that only their masks are made block by block: the others share one broadcast mask."""
    n_blocks = -(-length // block)
    head = min(-(-left // block), n_blocks)
    tail = max(head, min(n_blocks, (length - right) // block))
    step = max(1, queries // block)
    bounds = [0, head, *range(head + step, tail, step), tail, n_blocks]
    for first, last in zip(bounds, bounds[1:]):
        if first == last:
            continue
        start, stop = first * block, min(last * block, length)
        mask = masks(start, last - first)
        for row in range(batch):
            yield row, start, stop, left + (last - first) * block + right, mask


def _requires_grad(bias: ScoreBias | None, device: torch.device) -> bool:
    """Whether a bias is learned and being trained (the fused kernel gives no bias gradient)."""
    if bias is None or not torch.is_grad_enabled():
        return False
    probe = torch.zeros(1, 1, dtype=torch.long, device=device)
    return bias(probe, probe).requires_grad


def _chunk_mask_maker(
    length: int, window: int, causal: bool, block: int, bias: ScoreBias | None, start_position: int, dtype
):
    """masks(start, n_blocks) for `_ChunkedBand`: the band (the same for every block away from the sequence's
    ends: one (block, keys) mask broadcast over them; the chunks at the ends have their own, kept), keys outside
    the sequence masked, query slots past its end given every key of their block (their outputs are dropped),
    and the bias added."""
    left, right = _band_extent(window, causal, length)
    inference = torch.is_inference_mode_enabled()

    def masks(start: int, n_blocks: int) -> torch.Tensor:
        if start - left >= 0 and start + n_blocks * block + right <= length:
            interior = _band_block_mask(length, window, causal, block, -1, 1, dtype, inference)
            mask = interior  # (1, 1, block, keys): the kernel broadcasts it over the blocks
        else:
            mask = _band_block_mask(length, window, causal, block, start, n_blocks, dtype, inference)
        if bias is not None:
            first = start + block * torch.arange(n_blocks)[:, None]  # (nbc, 1)
            query_positions = start_position + first + torch.arange(block)
            key_positions = start_position + first - left + torch.arange(left + block + right)
            mask = mask + bias(query_positions, key_positions).to(dtype)
        return mask

    return masks


@functools.lru_cache(maxsize=16)
def _band_block_mask(
    length: int, window: int, causal: bool, block: int, start: int, n_blocks: int, dtype, inference: bool
) -> torch.Tensor:
    """(n_blocks, 1, block, keys) additive mask of the query blocks from `start` on; start -1: the interior
    blocks' one (1, 1, block, keys). Inference-mode tensors are kept apart (autograd cannot save them)."""
    del inference  # part of the cache key only
    left, right = _band_extent(window, causal, length)
    allowed = _block_band(window, causal, left, right, block)
    if start < 0:
        return additive_mask(allowed, dtype)[None, None]
    first = start + block * torch.arange(n_blocks)[:, None]
    key_positions = first - left + torch.arange(left + block + right)
    allowed = allowed & ((key_positions >= 0) & (key_positions < length))[:, None, :]
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return additive_mask(allowed, dtype)[:, None]


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
    the measured defaults, 32 in the CPU's chunked forward and 64 elsewhere). Backends (attention.backend):
    blockwise (the CPU's auto), flex (CUDA's auto; zoo/attention/flex.py), sdpa (one SDPA call under the dense
    band mask).
    """

    name = "local"
    supports_cross_attention = False
    supports_position_bias = True
    backends = ("blockwise", "flex", "sdpa")

    def __init__(self, *, window: int = 256, chunk_size: int | None = None) -> None:
        super().__init__()
        check_positive_int("attention.window (variant 'local')", window)
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        self.window = window
        self.chunk_size = chunk_size  # None: the measured defaults

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
        backend = resolve_backend(self.name, self.backend, q, k, dropout_p, bias, need_weights)
        if backend == "flex":
            pattern = functools.partial(band, window=self.window, causal=causal)
            out = flex_pattern_attention(q, k, v, pattern, self._flex_masks, (causal,), key_padding_mask)
            return out, None
        return sliding_window_attention(
            q, k, v, self.window, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p,
            need_weights=need_weights, block_size=self.chunk_size, bias=bias, dense=backend == "sdpa",
        )  # fmt: skip

    def new_cache(self) -> RollingKVCache:
        return RollingKVCache(self.window)

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
        keys, values, padding = cache.extend(k, v, new_tokens_padding(key_padding_mask, k.shape[2]))
        return sliding_window_attention(
            q, keys, values, self.window, causal=True, key_padding_mask=padding,
            need_weights=need_weights, block_size=self.chunk_size, bias=bias, start=cache.offset - keys.shape[2],
        )  # fmt: skip
