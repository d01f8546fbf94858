"""Position encodings: rotary (1D and axial N-D, with length scaling), sinusoidal and learned absolute.

RoPE length scaling (attention.rope_scaling, attention.rope_factor = s), for running a model past the length
L it was trained on (TokenLayout.max_length):
    linear   position interpolation (Chen et al. 2023): position p is rotated as p / s
    ntk      static NTK-aware scaling (bloc97 2023): base -> base * s^(d / (d - 2)), d the rotated dims
    dynamic  dynamic NTK (as transformers' "dynamic" rope type): for a sequence of n > L tokens the base is
             base * (s n / L - (s - 1))^(d / (d - 2)); up to L tokens the plain base
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.errors import check_choice


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (GPT-NeoX / LLaMA convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


ROPE_SCALINGS = ("linear", "ntk", "dynamic")


def inverse_frequencies(dim: int, base: float | torch.Tensor) -> torch.Tensor:
    """RoPE's base^(-2i / dim) for i = 0 .. dim / 2 - 1, float32 (the computation of GPT-NeoX / LLaMA)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half convention (GPT-NeoX / LLaMA).

    Positions are integer tensors of shape (T,) for sequences or (T, n_axes) for axial N-D grids
    (image patches: n_axes=2). With n axes the head dimension is split into n equal parts and each
    part is rotated by its own coordinate, as in axial 2D RoPE for ViTs (Heo et al. 2024).

    `scaling` (linear | ntk | dynamic, with `factor`; see the module docstring) stretches 1-D RoPE past the
    `trained_length`. Dynamic scaling depends on the length n = largest position + 1 of each call, as in
    transformers: a decoding step at position p rotates its key with the base of p + 1 tokens, and keys
    cached earlier keep theirs, so past the trained length cached decoding differs from a full forward
    (transformers' behaviour too). Unlike transformers' module, which keeps the largest base it has seen,
    each call here depends on its own positions only.

    Angles are always computed in float32 (the frequencies are not a buffer, so `model.half()` cannot
    round them). Consecutive positions start..start+T-1 (the default, and decoding from a cache
    offset) come from a cached cos/sin table; explicit positions are computed directly.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        n_axes: int = 1,
        scaling: str | None = None,
        factor: float = 1.0,
        trained_length: int | None = None,
    ) -> None:
        super().__init__()
        if head_dim % (2 * n_axes) != 0:
            raise ValueError(
                f"rotary embedding needs head_dim divisible by {2 * n_axes} for {n_axes} axes, got {head_dim}"
            )
        if scaling is not None:
            check_choice("attention.rope_scaling", scaling, ROPE_SCALINGS)
            if n_axes != 1:
                raise ValueError(
                    f"attention.rope_scaling={scaling!r} stretches 1-D sequences; a {n_axes}-axis grid (ViT) takes "
                    "plain rope"
                )
            if scaling != "linear" and head_dim <= 2:
                raise ValueError(f"attention.rope_scaling={scaling!r} needs head_dim > 2, got {head_dim}")
            if scaling == "dynamic" and trained_length is None:
                raise ValueError("attention.rope_scaling='dynamic' needs the trained length (TokenLayout.max_length)")
        self.head_dim = head_dim
        self.base = base
        self.n_axes = n_axes
        self.scaling = scaling
        self.factor = factor
        self.trained_length = trained_length
        axis_dim = head_dim // n_axes
        if scaling == "ntk":
            self.inv_freq = inverse_frequencies(axis_dim, base * factor ** (axis_dim / (axis_dim - 2)))
        else:
            self.inv_freq = inverse_frequencies(axis_dim, base)
        if scaling == "linear":
            self.inv_freq = self.inv_freq / factor  # p / s * theta = p * (theta / s)
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}, factor={self.factor}" if self.scaling else ""
        return f"head_dim={self.head_dim}, base={self.base}, n_axes={self.n_axes}{scaling}"

    def frequencies(self, length: int) -> torch.Tensor:
        """The inverse frequencies for a sequence of `length` tokens (only dynamic scaling depends on it)."""
        if self.scaling != "dynamic" or length <= self.trained_length:
            return self.inv_freq
        # In float32 tensors, as transformers computes it, so that both give the same frequencies.
        dim, factor = self.head_dim, self.factor
        stretch = torch.tensor(factor) * length / self.trained_length - (factor - 1)
        return inverse_frequencies(dim, self.base * stretch ** (dim / (dim - 2)))

    def _angles(self, positions: torch.Tensor, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
        """(T,) or (T, n_axes) positions -> (T, head_dim) angles, each axis laid out (freqs, freqs); the
        frequencies default to those of the positions' length."""
        pos = positions.to(torch.float32)
        if pos.ndim == 1:
            pos = pos[:, None]
        if pos.ndim != 2 or pos.shape[-1] != self.n_axes:
            raise ValueError(
                f"rotary embedding has {self.n_axes} axes: positions must have shape (T, {self.n_axes})"
                f"{' or (T,)' if self.n_axes == 1 else ''}, got {tuple(positions.shape)}"
            )
        if inv_freq is None:
            inv_freq = self.frequencies(int(positions.max()) + 1 if self.scaling == "dynamic" else 0)
        freqs = pos[:, :, None] * inv_freq.to(pos.device)  # (T, n_axes, axis_dim / 2)
        return torch.cat((freqs, freqs), dim=-1).flatten(1)

    def _range_cos_sin(self, start: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (length, head_dim) of positions start..start+length-1, from a table grown by doubling."""
        if self.n_axes != 1:
            raise ValueError(f"rotary embedding with {self.n_axes} axes needs positions of shape (T, {self.n_axes})")
        table = self._tables.get(device)
        if table is None or table[0].shape[0] < start + length:
            size = max(2 * table[0].shape[0] if table is not None else 0, start + length, 256)
            angles = self._angles(torch.arange(size, device=device), self.inv_freq)
            table = self._tables[device] = (angles.cos(), angles.sin())
        return table[0][start : start + length], table[1][start : start + length]

    def cos_sin(
        self,
        positions: torch.Tensor | None,
        dtype: torch.dtype = torch.float32,
        length: int | None = None,
        offset: int = 0,
        device: torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, head_dim) for `positions`, or for offset..offset+length-1 when positions is None."""
        if positions is None:
            if length is None:
                raise ValueError("rotary embedding needs positions or a length")
            device = torch.device(device or "cpu")
            if self.frequencies(offset + length) is not self.inv_freq:  # dynamic scaling past the trained length
                return self.cos_sin(torch.arange(offset, offset + length, device=device), dtype)
            cos, sin = self._range_cos_sin(offset, length, device)
        else:
            angles = self._angles(positions)
            cos, sin = angles.cos(), angles.sin()
        return cos.to(dtype), sin.to(dtype)

    def _rotate_with(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.n_axes == 1:
            return x * cos + rotate_half(x) * sin
        # Axial: rotate-half inside each axis' slice of the head dimension.
        rotated = torch.cat([rotate_half(part) for part in x.chunk(self.n_axes, dim=-1)], dim=-1)
        return x * cos + rotated * sin

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """Rotate x (B, H, T, head_dim) by positions (T,) or (T, n_axes); default offset..offset+T-1."""
        cos, sin = self.cos_sin(positions, x.dtype, x.shape[-2], offset, x.device)
        return self._rotate_with(x, cos, sin)

    def rotate_queries_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys of the same tokens with one cos/sin computation."""
        cos, sin = self.cos_sin(positions, q.dtype, q.shape[-2], offset, q.device)
        return self._rotate_with(q, cos, sin), self._rotate_with(k, cos, sin)


def sinusoidal_positions(length: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed sinusoidal table of Vaswani et al. 2017, section 3.5: (length, dim)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div[: dim // 2])
    return table


class SinusoidalPositionalEmbedding(nn.Module):
    """Adds the fixed sinusoidal table to (B, T, dim) inputs, starting at `offset`."""

    def __init__(self, dim: int, max_length: int = 4096) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_positions(max_length, dim), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.shape[1]
        if offset + length > self.table.shape[0]:
            raise ValueError(f"sequence length {offset + length} exceeds max_length {self.table.shape[0]}")
        return x + self.table[offset : offset + length].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned (max_length, dim) table to (B, T, dim) inputs, starting at `offset`."""

    def __init__(self, dim: int, max_length: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_length, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.shape[1]
        if offset + length > self.weight.shape[0]:
            raise ValueError(f"sequence length {offset + length} exceeds block size {self.weight.shape[0]}")
        return x + self.weight[offset : offset + length]


def grid_positions(grid: tuple[int, int], prefix_tokens: int = 0) -> torch.Tensor:
    """(prefix + rows * cols, 2) integer coordinates for 2-D rotary positions of image patches in row-major
    order: patches at (r + 1, c + 1), prefix tokens (a class token) at (0, 0), which leaves them unrotated."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=-1) + 1
    return torch.cat([torch.zeros(prefix_tokens, 2, dtype=coords.dtype), coords])
