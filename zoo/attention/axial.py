"""Axial attention (Ho et al. 2019): each token attends over its row and its column in one softmax.

Image patches attend along the rows and columns of the model's patch grid (TokenLayout.grid) at once, the
criss-cross union of the two axes (Huang et al. 2019) rather than two stacked passes. A 1-D sequence is
folded into rows of `row_length` tokens, which makes the same pattern work, causally too, for GPT and the
translation Transformer. Prefix tokens (a class token) are global: they attend to every token and every
token attends to them. Causal: only keys at earlier or equal positions, as everywhere.

Exactly softmax attention under that mask, computed blockwise (zoo/attention/blockwise.py) as a row part,
a column part and the prefix parts: O(n (rows + cols)), O(n sqrt(n)) for a square fold.
"""

from __future__ import annotations

import math

import torch

from zoo.attention.blockwise import Columns, Part, Rows, select
from zoo.attention.contract import TokenLayout
from zoo.attention.pattern import PatternKernel
from zoo.errors import check_positive_int


class AxialAttention(PatternKernel):
    """Row + column attention (Ho et al. 2019) with a KVCache for decoding. A model with a patch grid uses the
    grid's rows.

    Args:
        row_length: tokens per row of a 1-D sequence; None: ceil(sqrt(max_length)) of the model, or the width of
            the model's patch grid (which takes only None or its width).
    """

    name = "axial"
    example_options = ({"row_length": 4},)

    def __init__(self, *, row_length: int | None = None) -> None:
        super().__init__()
        check_positive_int("attention.row_length (variant 'axial')", row_length, allow_none=True)
        self.row_length = row_length

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        self.prefix = layout.prefix_tokens
        if layout.grid is not None:
            width = layout.grid[1]
            if self.row_length not in (None, width):
                raise ValueError(
                    f"attention.row_length={self.row_length} does not fit the model's {layout.grid[0]}x{width} "
                    f"patch grid (axial attention follows its rows and columns); valid: null or {width}"
                )
            self.width = width
        elif self.row_length is not None:
            self.width = self.row_length
        elif layout.max_length is not None:
            self.width = math.isqrt(layout.max_length - 1) + 1
        else:
            raise ValueError(
                "attention.row_length (variant 'axial') is null, which means ceil(sqrt(max length)), but this "
                "attention was not told the model's max length or grid; give attention.row_length, a positive int"
            )

    def extra_repr(self) -> str:
        return f"row_length={self.width}, prefix_tokens={self.prefix}"

    def allowed(self, query_positions: torch.Tensor, key_positions: torch.Tensor, causal: bool) -> torch.Tensor:
        prefix, width = self.prefix, self.width
        query_cell, key_cell = query_positions - prefix, key_positions - prefix
        same_row = query_cell.div(width, rounding_mode="floor") == key_cell.div(width, rounding_mode="floor")
        same_column = query_cell % width == key_cell % width
        allowed = (query_cell < 0) | (key_cell < 0) | same_row | same_column
        return allowed & (key_positions <= query_positions) if causal else allowed

    def parts(self, length: int, causal: bool) -> list[Part]:
        prefix = min(self.prefix, length)
        parts = []
        if length > prefix:
            rows = Rows(prefix, length, min(self.width, length - prefix))
            gather, key_positions = rows.windows(0, 0)
            in_row = rows.positions()[:, :, None] >= key_positions[:, None, :]
            parts.append(Part(rows, gather, key_positions, in_row | (not causal)))
            if length - prefix > self.width:
                columns = Columns(prefix, length, self.width)
                positions = columns.positions()
                earlier = positions[:, :, None] - positions[:, None, :]
                parts.append(Part(columns, columns.gather, positions, earlier > 0 if causal else earlier != 0))
            if prefix:  # every grid token sees the prefix tokens (all earlier, so causal changes nothing)
                sees_all = torch.ones(1, length - prefix, prefix, dtype=torch.bool)
                parts.append(Part(Rows(prefix, length, length - prefix), *select(torch.arange(prefix)), sees_all))
        if prefix:  # the prefix tokens see everything (causal: everything before them)
            heads = Rows(0, prefix, prefix)
            sees = heads.positions()[:, :, None] >= torch.arange(length)
            parts.append(Part(heads, *select(torch.arange(length)), sees | (not causal)))
        return parts
