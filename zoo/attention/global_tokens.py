"""Global tokens (Longformer, Beltagy et al. 2020; BigBird, Zaheer et al. 2020) and BigBird's random keys, added
to a pattern kernel's pattern (local's band, sparse's strided or fixed pattern).

    global     the first g tokens attend to every token and every token attends to them
    random     each block of `stride` queries also attends to r keys drawn for the block (BigBird, section 2):
               causal, from the blocks before it; bidirectional, from the whole sequence. The draw is fixed by
               a seed and the block's index only, so the same query block sees the same keys in training, in
               evaluation and while decoding (a causal block's draw does not depend on the length)

Causal attention keeps key <= query on every part. The union stays one softmax (zoo/attention/blockwise.py):
the pattern's parts lose the global rows and columns, and two parts add them back (every query x the g global
keys; the g global queries x the other keys), a third the random keys outside both, so the parts stay disjoint
and no (n, n) tensor is made: O(n g) for the global parts, O(n r) for the random ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import torch

import zoo.attention.pattern as pattern_kernels
from zoo.attention.blockwise import Part, Rows, select
from zoo.attention.contract import AttentionCall
from zoo.attention.fast import band as fast_band
from zoo.attention.fast import use_fast_kernels
from zoo.attention.flex import resolve_backend
from zoo.attention.pattern import PatternKernel
from zoo.attention.sliding_window import band, band_extent

RANDOM_KEYS_SEED = 0  # the seed of BigBird's random keys: block b's are randperm(range, seed * 1_000_003 + b)


def check_count(name: str, value: object) -> None:
    """ValueError naming `name` unless value is an int >= 0 (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def global_allowed(
    allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, global_tokens: int, causal: bool
) -> torch.Tensor:
    """The pattern `allowed` (already causal where asked) plus the global rows and columns."""
    extra = (query_positions < global_tokens) | (key_positions < global_tokens)
    if causal:
        extra = extra & (key_positions <= query_positions)
    return allowed | extra


def random_key_table(length: int, stride: int, random_keys: int, causal: bool) -> torch.Tensor:
    """(query blocks, r) int64: the random keys of each block of `stride` queries, -1 where a block has fewer
    (a causal block b draws from the b * stride keys before it; the first has none). Distinct within a block."""
    blocks = -(-length // stride)
    table = torch.full((blocks, random_keys), -1, dtype=torch.long)
    for block in range(blocks):  # one draw per block (not per token), cached per length by the kernel
        pool = block * stride if causal else length
        generator = torch.Generator().manual_seed(RANDOM_KEYS_SEED * 1_000_003 + block)
        drawn = torch.randperm(pool, generator=generator)[:random_keys]
        table[block, : len(drawn)] = drawn
    return table


def random_allowed(
    table: torch.Tensor, stride: int, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """Whether the key is one of the query's block's random keys (broadcasting positions; dense sizes only)."""
    rows = table.to(query_positions.device)[(query_positions // stride).clamp(0, table.shape[0] - 1)]  # (..., r)
    return (rows == key_positions[..., None]).any(dim=-1)


def _gather_rows(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B, H, n, D) -> (B * blocks, H, r, D): each query block's random keys (slot -1 reads key 0, masked)."""
    batch, heads, _, dim = x.shape
    blocks, count = table.shape
    picked = x.index_select(2, table.clamp(min=0).flatten().to(x.device))  # (B, H, blocks * r, D)
    return picked.view(batch, heads, blocks, count, dim).transpose(1, 2).reshape(batch * blocks, heads, count, dim)


def _key_range(start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
    """The keys start..stop-1 of (B, H, n, D) for a one-block layout: a view, not a gathered copy."""
    return x[:, :, start:stop]


def with_global_and_random_parts(
    parts: list[Part],
    pattern,
    length: int,
    global_tokens: int,
    causal: bool,
    random_table: torch.Tensor | None = None,
    stride: int = 1,
) -> list[Part]:
    """The pattern's disjoint `parts` for `length` tokens with the global rows and columns and the random keys
    added, still disjoint. `pattern(query_positions, key_positions)`: the pattern alone (already causal)."""
    g = min(global_tokens, length)
    result = []
    for part in parts:  # the pattern, less the global rows and columns
        query_positions = part.layout.positions()
        keep = (part.key_positions >= g)[:, None, :] & (query_positions >= g)[:, :, None]
        result.append(replace(part, allowed=part.allowed & keep, masks={}))
    if g > 0:
        positions = torch.arange(length)
        every = Rows(0, length, length)  # every query x the g global keys: one block of (n, g)
        to_global = positions[:, None] >= positions[None, :g] if causal else torch.ones(length, g, dtype=torch.bool)
        result.append(Part(every, *select(positions[:g]), to_global[None]))
        if length > g and not causal:  # the g global queries x the other keys: one block of (g, n - g) (causal
            # attention gives them none: they come before every other key)
            rest = torch.ones(g, length - g, dtype=torch.bool)
            gather = functools.partial(_key_range, g, length)
            result.append(Part(Rows(0, g, g), gather, positions[None, g:], rest[None]))
    if random_table is not None:
        blocks = Rows(0, length, stride)
        query_positions, key_positions = blocks.positions(), random_table  # (blocks, stride), (blocks, r)
        q, k = query_positions[:, :, None], key_positions[:, None, :]
        allowed = ~pattern(q, k) & (k >= g) & (q >= g) & (k >= 0) & (q < length)
        if causal:
            allowed = allowed & (k <= q)
        result.append(Part(blocks, functools.partial(_gather_rows, random_table), key_positions, allowed))
    return result


class GlobalTokenPattern(PatternKernel):
    """A kernel's pattern (a function of positions, and its disjoint blockwise parts) with `global_tokens`: what
    LocalAttention computes with attention.global_tokens (Longformer's band + global tokens), through the pattern
    kernels' machinery (blocks, dense path for weights and short sequences, KVCache decoding, position bias)."""

    def __init__(self, name: str, pattern: Callable, pattern_parts: Callable, global_tokens: int) -> None:
        super().__init__()
        self.name = name  # in its errors, the user's variant
        self.pattern, self.pattern_parts, self.global_tokens = pattern, pattern_parts, global_tokens

    def extra_repr(self) -> str:
        return f"global_tokens={self.global_tokens}"

    def allowed(self, query_positions: torch.Tensor, key_positions: torch.Tensor, causal: bool) -> torch.Tensor:
        allowed = self.pattern(query_positions, key_positions, causal=causal)
        return global_allowed(allowed, query_positions, key_positions, self.global_tokens, causal)

    def parts(self, length: int, causal: bool) -> list[Part]:
        pattern = functools.partial(self.pattern, causal=causal)
        return with_global_and_random_parts(
            self.pattern_parts(length, causal), pattern, length, self.global_tokens, causal
        )


class BandWithGlobalTokens(GlobalTokenPattern):
    """LocalAttention's band with Longformer's global tokens, as a piece the kernel composes
    (attention.global_tokens): the band as one blockwise part (blocks of `block` queries, each with its window of
    keys) and the global rows and columns beside it. On the CPU, where the parts would run blockwise without
    weights, padding, dropout or a position bias, the fast path (zoo/attention/fast/band.py) computes the chunked
    band and the global rows and columns merged by log-sum-exp instead."""

    def __init__(self, window: int, block: int, chunk_size: int | None, global_tokens: int) -> None:
        def band_parts(length: int, causal: bool) -> list[Part]:
            rows = Rows(0, length, min(block, length))
            gather, key_positions = rows.windows(*band_extent(window, causal, length))
            allowed = band(rows.positions()[:, :, None], key_positions[:, None, :], window, causal)
            return [Part(rows, gather, key_positions, allowed)]

        super().__init__("local", functools.partial(band, window=window), band_parts, global_tokens)
        self.window, self.block, self.chunk_size = window, block, chunk_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall):
        if use_fast_kernels() and self._fast_path_applies(q, k, call):
            extent = band_extent(self.window, call.causal, q.shape[2])
            out = fast_band.chunked_band_with_global_tokens(
                q, k, v, band, self.window, call.causal, extent, self.block, self.chunk_size, self.global_tokens
            )
            return out, None
        return super().forward(q, k, v, call)

    def _fast_path_applies(self, q: torch.Tensor, k: torch.Tensor, call: AttentionCall) -> bool:
        """Where the parts would run blockwise (self-attention, longer than the pattern kernels' dense threshold)
        without weights, key padding, dropout or a position bias."""
        backend = resolve_backend(self.name, self.backend, q, k, call.dropout_p, call.bias, call.need_weights)
        return (
            backend == "blockwise"
            and not call.need_weights
            and call.bias is None
            and q.shape[2] > pattern_kernels.DENSE_MAX_LENGTH  # read when called: tests lower it
            and fast_band.applies(q, call.key_padding_mask, call.dropout_p, call.bias)
        )
