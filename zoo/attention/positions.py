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
    """Rotary position embedding (Su et al. 2021), rotate-half convention, cached cos/sin.

    Positions are integer tensors of shape (T,) for sequences or (T, n_axes) for axial N-D grids
    (image patches: n_axes=2). With n axes the head dimension is split into n equal parts and each
    part is rotated by its own coordinate, as in axial 2D RoPE for ViTs (Heo et al. 2024).
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
        inv_freq = 1.0 / (base ** (torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape (T, head_dim) for the given positions."""
        key = None
        if positions.ndim == 1 and not torch.compiler.is_compiling():
            # Contiguous ranges (the common case) are cached by (start, length, device, dtype).
            start, length = int(positions[0]) if len(positions) else 0, len(positions)
            key = (start, length, positions.device, dtype)
            if key in self._cache:
                return self._cache[key]
        pos = positions.to(self.inv_freq.dtype)
        if pos.ndim == 1:
            pos = pos[:, None]
        if pos.shape[-1] != self.n_axes:
            raise ValueError(f"rotary embedding has {self.n_axes} axes, got positions of shape {tuple(positions.shape)}")
        # One angle table per axis, each laid out rotate-half style: (freqs, freqs).
        parts = []
        for axis in range(self.n_axes):
            freqs = pos[:, axis, None] * self.inv_freq  # (T, axis_dim/2)
            parts.append(torch.cat((freqs, freqs), dim=-1))
        angles = torch.cat(parts, dim=-1)  # (T, head_dim)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        if key is not None and torch.equal(positions, torch.arange(key[0], key[0] + key[1], device=positions.device)):
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = (cos, sin)
        return cos, sin

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x of shape (B, H, T, head_dim) by its positions (T,) or (T, n_axes)."""
        cos, sin = self.cos_sin(positions, x.dtype)
        if self.n_axes == 1:
            return x * cos + rotate_half(x) * sin
        # Axial: rotate-half inside each axis' slice of the head dimension.
        chunks = x.chunk(self.n_axes, dim=-1)
        rotated = torch.cat([rotate_half(c) for c in chunks], dim=-1)
        return x * cos + rotated * sin


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

    def __init__(self, dim: int, max_len: int = 4096) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_positions(max_len, dim), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.shape[1]
        if offset + length > self.table.shape[0]:
            raise ValueError(f"sequence length {offset + length} exceeds max_len {self.table.shape[0]}")
        return x + self.table[offset : offset + length].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned (max_len, dim) table to (B, T, dim) inputs, starting at `offset`."""

    def __init__(self, dim: int, max_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.shape[1]
        if offset + length > self.weight.shape[0]:
            raise ValueError(f"sequence length {offset + length} exceeds block size {self.weight.shape[0]}")
        return x + self.weight[offset : offset + length]
