"""Blockwise attention over a union of key groups: the machinery of the pattern kernels (zoo/attention/pattern.py).

A sparse pattern is written as a few *parts*. A part arranges the queries in blocks (consecutive `Rows`, or
the `Columns` of the sequence folded into rows) and gives each block a few keys, gathered once, with a
boolean mask of which of them each query attends to. The parts' allowed keys are disjoint, so merging the
parts' results through their log-sum-exps is exactly one softmax over the union of all of them:

    lse_i = log sum_g exp(lse_gi),    out_i = sum_g exp(lse_gi - lse_i) out_gi

(the merge of blockwise attention, Rabe & Staats 2021, and of flash attention's tiles, Dao et al. 2022).
No (n, n) tensor is made: each part costs (queries x keys of its blocks).

Each part is the explicit formula under autograd (`_explicit_part`). On the CPU without attention dropout or a
learned score bias, the fast path (zoo/attention/fast/blocks.py) runs every part through PyTorch's fused flash
kernel instead; both paths are checked against the masked O(n^2) formula in tests/attention/.

Positions are absolute token indices. A part knows the position of every query slot and key it holds (-1:
no key there), so masks, key padding and an additive score bias are all functions of positions: a bias
`score_bias(query_positions, key_positions)` gets int tensors (..., Tq) and (..., Tk) and returns
(..., H, Tq, Tk) (e.g. ALiBi's -slope_h |i - j|), added to the scores before the softmax.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from zoo.attention.contract import ScoreBias
from zoo.attention.fast import blocks as fast_blocks
from zoo.attention.fast import use_fast_kernels

# Sequences up to this length run as one fused SDPA call under the dense (n, n) mask (256 KiB of float mask
# per batch row): below it the parts' fixed cost per call exceeds the work they save (re-measure with
# `experiments/attention_benchmark.py --rows sparse axial --lengths 128 256 512`; figures in recipes.md).
DENSE_MAX_LENGTH = 256


def blocked_windows(x: torch.Tensor, left: int, right: int, block: int, n_blocks: int) -> torch.Tensor:
    """(B, H, n, D) -> (B * n_blocks, H, left + block + right, D): the keys around every query block.

    One flat zero-padded copy (left pad, each sequence padded to n_blocks * block, right pad), then
    overlapping windows as a strided view: no key is duplicated in memory. Key j of block b sits at
    position b * block - left + j; a window may reach past its own sequence, so callers mask positions
    outside [0, n).
    """
    if use_fast_kernels() and left % block == 0 and right % block == 0 and torch.is_grad_enabled() and x.requires_grad:
        return fast_blocks.block_windows(x, left, right, block, n_blocks, _windows)
    return _windows(x, left, right, block, n_blocks)


def _windows(x: torch.Tensor, left: int, right: int, block: int, n_blocks: int) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    padded = n_blocks * block
    buffer = x.new_empty(left + batch * padded + right, heads, dim)
    buffer[:left].zero_()
    buffer[left + batch * padded :].zero_()
    body = buffer[left : left + batch * padded].view(batch, padded, heads, dim)
    body[:, :length] = x.transpose(1, 2)
    body[:, length:].zero_()
    return buffer.unfold(0, left + block + right, block).transpose(-1, -2)


def _pad_tokens(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad dimension 2 (tokens) of (B, H, n, *rest) to `size`."""
    missing = size - x.shape[2]
    if missing == 0:
        return x
    return F.pad(x, (0, 0) * (x.ndim - 3) + (0, missing))


@dataclass(frozen=True)
class _Fold:
    """Tokens start..stop-1 folded row-major into rows of `width` (the last row padded); the blocks are the
    grid's rows (Rows) or its columns (Columns)."""

    start: int
    stop: int
    width: int
    axis: ClassVar[int]

    @property
    def grid(self) -> tuple[int, int]:
        return -(-(self.stop - self.start) // self.width), self.width

    @property
    def count(self) -> int:
        return self.grid[self.axis]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, n, *rest) -> (B * count, H, block size, *rest)."""
        (batch, heads), rest, (rows, width) = x.shape[:2], x.shape[3:], self.grid
        x = _pad_tokens(x[:, :, self.start : self.stop], rows * width)
        x = x.view(batch, heads, rows, width, *rest).movedim(2 + self.axis, 1)
        return x.reshape(batch * self.count, heads, self.grid[1 - self.axis], *rest)

    def scatter(self, y: torch.Tensor, batch: int) -> torch.Tensor:
        """(B * count, H, block size, *rest) -> (B, H, stop - start, *rest): the inverse of `gather`."""
        heads, rest, (rows, width) = y.shape[1], y.shape[3:], self.grid
        y = y.view(batch, self.count, heads, y.shape[2], *rest).movedim(1, 2 + self.axis)
        return y.reshape(batch, heads, rows * width, *rest)[:, :, : self.stop - self.start]


class Rows(_Fold):
    """The queries start..stop-1 in consecutive blocks of `width` (the last one padded)."""

    axis = 0

    def positions(self) -> torch.Tensor:
        """(count, width) position of every query slot (slots past `stop` are padding)."""
        return (self.start + torch.arange(self.count * self.width)).view(self.count, self.width)

    def windows(self, left: int, right: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
        """The keys from `left` before to `right` after every block: a gather (B, H, n, D) -> (B * count, H,
        K, D) and the keys' positions (count, K) (-1 outside start..stop-1)."""
        offsets = torch.arange(self.count)[:, None] * self.width - left
        positions = self.start + offsets + torch.arange(left + self.width + right)
        positions = positions.masked_fill((positions < self.start) | (positions >= self.stop), -1)
        return functools.partial(self._window_keys, left, right), positions

    def _window_keys(self, left: int, right: int, x: torch.Tensor) -> torch.Tensor:
        return blocked_windows(x[:, :, self.start : self.stop], left, right, self.width, self.count)


class Columns(_Fold):
    """The tokens start..stop-1 folded into rows of `width` (the last one padded), grouped by column:
    block c holds the tokens of column c, top to bottom."""

    axis = 1

    def positions(self) -> torch.Tensor:
        """(width, rows) position of every slot, -1 past `stop`."""
        rows = torch.arange(self.grid[0])[None, :]
        positions = self.start + rows * self.width + torch.arange(self.width)[:, None]
        return positions.masked_fill(positions >= self.stop, -1)


Layout = Rows | Columns


@dataclass
class Part:
    """One group of keys for the queries of `layout`: `gather` takes keys or values (B, H, n, D) to the
    blocks' (B * count, H, K, D), `key_positions` (count, K) are their positions (-1: no key there) and
    `allowed` (count, Tq, K) says which of them each query slot attends to. Parts depend on the length
    only, so kernels build them once per length (`PatternKernel.cached_parts`) and the additive masks
    made from them are kept here."""

    layout: Layout
    gather: Callable[[torch.Tensor], torch.Tensor]
    key_positions: torch.Tensor
    allowed: torch.Tensor
    masks: dict = field(default_factory=dict, repr=False)


def select(positions: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
    """The keys at `positions` (S,) for a one-block layout: a gather and the positions (1, S)."""
    return functools.partial(_select_keys, positions), positions[None]


def _select_keys(positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x.index_select(2, positions.to(x.device))


def _part_masks(
    part: Part, batch: int, key_padding_mask: torch.Tensor | None, score_bias: ScoreBias | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The part's additive mask (B * count, 1 | H, Tq, K) (or count, for B = 1) and whether each query slot
    has a key at all (same leading dimension, 1, Tq). Kept on the part when there is no padding or bias."""
    key = (batch, dtype, torch.is_inference_mode_enabled())  # inference tensors cannot be saved for backward
    if key_padding_mask is None and score_bias is None and key in part.masks:
        return part.masks[key]
    allowed = part.allowed & (part.key_positions >= 0)[:, None, :]  # (count, Tq, K)
    if key_padding_mask is not None:
        padded = key_padding_mask.bool()[:, part.key_positions.clamp(min=0)]  # (B, count, K)
        allowed = (allowed[None] & ~padded[:, :, None, :]).flatten(0, 1)  # (B * count, Tq, K)
    elif batch > 1:  # the batch rows share one mask
        allowed = allowed[None].expand(batch, *allowed.shape).flatten(0, 1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
    mask = mask[:, None]
    if score_bias is not None:
        bias = score_bias(part.layout.positions().to(allowed.device), part.key_positions)  # (count, H, Tq, K)
        if batch > 1:
            bias = bias[None].expand(batch, *bias.shape).flatten(0, 1)
        mask = mask + bias.to(dtype)
    result = mask, allowed.any(dim=-1)[:, None]
    if key_padding_mask is None and score_bias is None:
        part.masks[key] = result
    return result


def _explicit_part(q, k, v, mask, has_key, dropout_p):
    """softmax attention of one part and its log-sum-exp (-inf where a query has no key), by the formula."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    # Rows without keys are unmasked before the log-sum-exp and zeroed after: no NaN in values or gradients.
    scores = scores + mask.masked_fill(~has_key[..., None], 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(~has_key[..., None], 0.0)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return torch.matmul(probs, v), lse.masked_fill(~has_key, float("-inf"))


def _merge(
    layouts: list[Layout], outs: list[torch.Tensor], lses: list[torch.Tensor], shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """The parts' (out, lse) in their blocks -> the joint softmax output (B, n, H, D) and lse (B, H, n)."""
    batch, heads, length, dim = shape
    stacked = []
    for layout, lse in zip(layouts, lses):
        lse = layout.scatter(lse, batch)  # (B, H, stop - start)
        stacked.append(F.pad(lse, (layout.start, length - layout.stop), value=float("-inf")))
    stacked = torch.stack(stacked)  # (P, B, H, n)
    any_key = (stacked > float("-inf")).any(dim=0)
    stacked = stacked.masked_fill(~any_key, 0.0)  # queries with no key anywhere: zeros, finite gradients
    lse = torch.logsumexp(stacked, dim=0)
    weights = torch.exp(stacked - lse)
    out = outs[0].new_zeros(batch, length, heads, dim)
    for index, (layout, part_out) in enumerate(zip(layouts, outs)):
        # In the output's (B, n, H, D) order, one fused multiply-add (a transposed temporary costs a copy).
        weight = weights[index, :, :, layout.start : layout.stop].transpose(1, 2)[..., None].to(part_out.dtype)
        out[:, layout.start : layout.stop].addcmul_(layout.scatter(part_out, batch).transpose(1, 2), weight)
    return out, lse.masked_fill(~any_key, 0.0)


def union_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    parts: list[Part],
    *,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    score_bias: ScoreBias | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """One softmax over the union of the parts' keys: q, k, v (B, H, n, D) -> (B, H, n, D).

    key_padding_mask (B, n) bool, True = padding; queries with no key at all output zeros. `fused`: None
    picks the fast path (zoo/attention/fast/blocks.py) where it applies and the switch is on. The output is a
    (B, H, n, D) view of (B, n, H, D) memory, the layout the output projection wants.
    """
    batch = q.shape[0]
    masks, has_keys = zip(*(_part_masks(part, batch, key_padding_mask, score_bias, q.dtype) for part in parts))
    if fused is None:
        learned = any(mask.requires_grad for mask in masks)
        fused = use_fast_kernels() and fast_blocks.fused_kernel_applies(q, dropout_p, learned)
    layouts = [part.layout for part in parts]
    queries = [part.layout.gather(q) for part in parts]
    keys = [part.gather(k) for part in parts]
    values = [part.gather(v) for part in parts]
    if fused:
        out = fast_blocks.fused_union(_merge, layouts, masks, has_keys, q.shape, queries, keys, values)
    else:
        results = [_explicit_part(*inputs, dropout_p) for inputs in zip(queries, keys, values, masks, has_keys)]
        out, _ = _merge(layouts, [o for o, _ in results], [lse for _, lse in results], q.shape)
    return out.transpose(1, 2)
