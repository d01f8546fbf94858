"""The Sparse Transformer's factorised patterns (Child et al. 2019, section 4.2), merged into one softmax.

With stride l, query i attends to key j (d = i - j; causal also needs d >= 0):

    strided   |d| < l  (the previous l positions, itself included)  or  d mod l == 0  (every l-th one)
    fixed     j in i's block of l positions  or  j mod l >= l - summary  (the last `summary` positions
              of every block, its "summary" cells)

The bidirectional strided pattern is the causal one mirrored; the bidirectional fixed pattern is the
paper's (every block's summaries, also later ones). Both parts share one softmax (the paper's "merged"
attention). Computed blockwise (zoo/attention/blockwise.py): strided as a band of l keys around blocks of
queries plus the columns of the sequence folded into rows of l; fixed as blocks of l plus the summaries.
At l ~ sqrt(n) that is O(n sqrt(n)) time and memory; no (n, n) tensor is made.

`global_tokens` and `random_keys` add Longformer's / BigBird's global tokens and BigBird's random keys per
block of l queries to either pattern (zoo/attention/global_tokens.py).
"""

from __future__ import annotations

import functools
import math

import torch

from zoo.attention.blockwise import Columns, Part, Rows, select
from zoo.attention.contract import AttentionCall, TokenLayout
from zoo.attention.flex import resolve_backend
from zoo.attention.global_tokens import (
    check_count,
    global_allowed,
    random_allowed,
    random_key_table,
    with_global_and_random_parts,
)
from zoo.attention.pattern import PatternKernel
from zoo.errors import check_choice, check_positive_int

PATTERNS = ("strided", "fixed")
BAND_BLOCK_SIZE = 64  # queries per block of the strided band (as local attention's measured default)


class SparseAttention(PatternKernel):
    """Strided or fixed sparse attention (Child et al. 2019) with a KVCache for decoding.

    Args:
        pattern: strided | fixed.
        stride: l, the block length; None: ceil(sqrt(max_length)) of the model.
        summary: fixed only: summary positions per block; None: max(1, stride // 8).
        global_tokens: g: the first g tokens attend to all and all to them; 0: none.
        random_keys: r: BigBird's random keys per block of l queries, fixed by a seed (not with backend flex).
    """

    name = "sparse"
    example_options = (
        {"stride": 3},
        {"pattern": "fixed", "stride": 4, "summary": 2},
        {"stride": 4, "global_tokens": 2, "random_keys": 2},
    )

    def __init__(
        self,
        *,
        pattern: str = "strided",
        stride: int | None = None,
        summary: int | None = None,
        global_tokens: int = 0,
        random_keys: int = 0,
    ) -> None:
        super().__init__()
        check_count("attention.global_tokens (variant 'sparse')", global_tokens)
        check_count("attention.random_keys (variant 'sparse')", random_keys)
        self.global_tokens = global_tokens
        self.random_keys = random_keys
        self._random_tables: dict = {}  # (length, causal) -> random_key_table
        check_choice("attention.pattern (variant 'sparse')", pattern, PATTERNS)
        check_positive_int("attention.stride (variant 'sparse')", stride, allow_none=True)
        check_positive_int("attention.summary (variant 'sparse')", summary, allow_none=True)
        if summary is not None and pattern != "fixed":
            raise ValueError(
                f"attention.summary applies to pattern 'fixed' only, got summary={summary} with {pattern!r}"
            )
        if summary is not None and stride is not None and summary > stride:
            raise ValueError(f"attention.summary must be at most attention.stride={stride}, got {summary}")
        self.pattern = pattern
        self.stride = stride
        self.summary = summary

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        if self.stride is None and layout.max_length is None:
            raise ValueError(
                "attention.stride (variant 'sparse') is null, which means ceil(sqrt(max length)), but this "
                "attention was not told the model's max length; give attention.stride, a positive int"
            )
        self.step = self.stride or math.isqrt(layout.max_length - 1) + 1
        self.summaries = (self.summary or max(1, self.step // 8)) if self.pattern == "fixed" else 0
        if self.summaries > self.step:
            raise ValueError(f"attention.summary must be at most the stride {self.step}, got {self.summaries}")

    def extra_repr(self) -> str:
        fixed = f", summary={self.summaries}" if self.pattern == "fixed" else ""
        extra = f", global_tokens={self.global_tokens}" if self.global_tokens else ""
        extra += f", random_keys={self.random_keys}" if self.random_keys else ""
        return f"pattern={self.pattern}, stride={self.step}{fixed}{extra}"

    def use_backend(self, backend: str) -> None:
        if backend == "flex" and self.random_keys:
            raise ValueError(
                f"attention.backend='flex' has no random keys (attention.random_keys={self.random_keys}); use "
                "backend auto, blockwise or sdpa"
            )
        super().use_backend(backend)

    def check_packing(self) -> None:
        if self.random_keys:  # the random table is drawn for the padded length, not for each document's own
            raise ValueError(
                f"packed documents do not combine with attention.random_keys={self.random_keys} (variant 'sparse'); "
                "use random_keys=0"
            )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall):
        if not self.random_keys:
            return super().forward(q, k, v, call)
        # Random keys are a table, not a function of positions: the blocks (or the dense mask), never flex.
        backend = "sdpa" if self.backend == "sdpa" else "blockwise"
        resolve_backend(self.name, backend, q, k, call.dropout_p, call.bias, call.need_weights)  # self-attention?
        return self._attend(q, k, v, call, dense=backend == "sdpa")

    def random_table(self, length: int, causal: bool) -> torch.Tensor:
        """BigBird's random keys of every query block for `length` tokens (kept for a few lengths)."""
        key = (length, causal)
        if key not in self._random_tables:
            if len(self._random_tables) >= 8:
                self._random_tables.pop(next(iter(self._random_tables)))
            self._random_tables[key] = random_key_table(length, self.step, self.random_keys, causal)
        return self._random_tables[key]

    def allowed(self, query_positions: torch.Tensor, key_positions: torch.Tensor, causal: bool) -> torch.Tensor:
        """The pattern with its global tokens (the random keys need the length: `dense_mask`)."""
        allowed = self.pattern_allowed(query_positions, key_positions, causal)
        if not self.global_tokens:
            return allowed
        return global_allowed(allowed, query_positions, key_positions, self.global_tokens, causal)

    def dense_mask(self, q_len: int, k_len: int, causal: bool, device: torch.device) -> torch.Tensor:
        allowed = super().dense_mask(q_len, k_len, causal, device)
        if not self.random_keys:
            return allowed
        rows = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        columns = torch.arange(k_len, device=device)[None, :]
        extra = random_allowed(self.random_table(k_len, causal), self.step, rows, columns)
        return allowed | (extra & (columns <= rows) if causal else extra)

    def parts(self, length: int, causal: bool) -> list[Part]:
        parts = self.pattern_parts(length, causal)
        if not self.global_tokens and not self.random_keys:
            return parts
        table = self.random_table(length, causal) if self.random_keys else None
        pattern = functools.partial(self.pattern_allowed, causal=causal)
        return with_global_and_random_parts(parts, pattern, length, self.global_tokens, causal, table, self.step)

    def pattern_allowed(self, query_positions: torch.Tensor, key_positions: torch.Tensor, causal: bool) -> torch.Tensor:
        stride, distance = self.step, query_positions - key_positions
        if self.pattern == "strided":
            allowed = (distance.abs() < stride) | (distance % stride == 0)
        else:
            same_block = query_positions // stride == key_positions // stride
            allowed = same_block | (key_positions % stride >= stride - self.summaries)
        return allowed & (distance >= 0) if causal else allowed

    def pattern_parts(self, length: int, causal: bool) -> list[Part]:
        stride = self.step
        if self.pattern == "strided":
            # The band |d| < l around blocks of queries, then every l-th key further away: the column of
            # the sequence folded into rows of l.
            rows = Rows(0, length, min(BAND_BLOCK_SIZE, length))
            left = min(stride, length - 1)
            gather, key_positions = rows.windows(left, 0 if causal else left)
            distance = rows.positions()[:, :, None] - key_positions[:, None, :]
            band = (distance.abs() < stride) & ((distance >= 0) | (not causal))
            parts = [Part(rows, gather, key_positions, band)]
            if length > stride:
                columns = Columns(0, length, stride)
                positions = columns.positions()
                distance = positions[:, :, None] - positions[:, None, :]
                far = distance >= stride if causal else distance.abs() >= stride
                parts.append(Part(columns, columns.gather, positions, far))
            return parts
        # Fixed: each block of l attends to itself, then to the summaries of the other blocks.
        blocks = Rows(0, length, min(stride, length))
        gather, key_positions = blocks.windows(0, 0)
        own = blocks.positions()[:, :, None] >= key_positions[:, None, :]
        parts = [Part(blocks, gather, key_positions, own | (not causal))]
        positions = torch.arange(length)
        summary_positions = positions[positions % stride >= stride - self.summaries]
        if length > stride and len(summary_positions):
            query_block, key_block = positions[:, None] // stride, summary_positions[None, :] // stride
            other = key_block < query_block if causal else key_block != query_block
            parts.append(Part(Rows(0, length, length), *select(summary_positions), other[None]))
        return parts
