"""Position encodings: rotary (1D and axial N-D), sinusoidal and learned absolute."""

from __future__ import annotations

import math

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (GPT-NeoX / LLaMA convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half convention (GPT-NeoX / LLaMA).

    Positions are integer tensors of shape (T,) for sequences or (T, n_axes) for axial N-D grids
    (image patches: n_axes=2). With n axes the head dimension is split into n equal parts and each
    part is rotated by its own coordinate, as in axial 2D RoPE for ViTs (Heo et al. 2024).

    Angles are always computed in float32 (the frequencies are not a buffer, so `model.half()` cannot
    round them). Consecutive positions start..start+T-1 (the default, and decoding from a cache
    offset) come from a cached cos/sin table; explicit positions are computed directly.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, n_axes: int = 1) -> None:
        super().__init__()
        if head_dim % (2 * n_axes) != 0:
            raise ValueError(
                f"rotary embedding needs head_dim divisible by {2 * n_axes} for {n_axes} axes, got {head_dim}"
            )
        self.head_dim = head_dim
        self.base = base
        self.n_axes = n_axes
        axis_dim = head_dim // n_axes
        self.inv_freq = 1.0 / (base ** (torch.arange(0, axis_dim, 2, dtype=torch.int64).float() / axis_dim))
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, n_axes={self.n_axes}"

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) or (T, n_axes) positions -> (T, head_dim) angles, each axis laid out (freqs, freqs)."""
        pos = positions.to(torch.float32)
        if pos.ndim == 1:
            pos = pos[:, None]
        if pos.ndim != 2 or pos.shape[-1] != self.n_axes:
            raise ValueError(
                f"rotary embedding has {self.n_axes} axes: positions must have shape (T, {self.n_axes})"
                f"{' or (T,)' if self.n_axes == 1 else ''}, got {tuple(positions.shape)}"
            )
        freqs = pos[:, :, None] * self.inv_freq.to(pos.device)  # (T, n_axes, axis_dim / 2)
        return torch.cat((freqs, freqs), dim=-1).flatten(1)

    def _range_cos_sin(self, start: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (length, head_dim) of positions start..start+length-1, from a table grown by doubling."""
        if self.n_axes != 1:
            raise ValueError(f"rotary embedding with {self.n_axes} axes needs positions of shape (T, {self.n_axes})")
        table = self._tables.get(device)
        if table is None or table[0].shape[0] < start + length:
            size = max(2 * table[0].shape[0] if table is not None else 0, start + length, 256)
            angles = self._angles(torch.arange(size, device=device))
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
            cos, sin = self._range_cos_sin(offset, length, torch.device(device or "cpu"))
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
