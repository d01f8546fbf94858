"""Position encodings: rotary (1D and axial N-D, with length scaling), sinusoidal and learned absolute.

RoPE length scaling (attention.rope_scaling, attention.rope_factor = s), for running a model past the length
L it was trained on (TokenLayout.max_length):
    linear   position interpolation (Chen et al. 2023): position p is rotated as p / s
    ntk      static NTK-aware scaling (bloc97 2023): base -> base * s^(d / (d - 2)), d the rotated dims
    dynamic  dynamic NTK (as transformers' "dynamic" rope type): for a sequence of n > L tokens the base is
             base * (s n / L - (s - 1))^(d / (d - 2)); up to L tokens the plain base
    yarn     YaRN (Peng et al. 2023): per frequency, a ramp from extrapolation (fast rotations, more than
             beta_fast turns in the original length) to interpolation by s (slower than beta_slow turns),
             and cos/sin scaled by the attention factor 0.1 ln s + 1 (eq. 21), i.e. the logits by its square
    llama3   Llama 3.1's scaling: wavelengths longer than L / low_freq_factor interpolated by s, shorter than
             L / high_freq_factor kept, a smooth blend between
yarn and llama3 take further settings (attention.rope_parameters, transformers' names): original_max_position_
embeddings (L; default the trained length), beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim,
truncate (yarn); low_freq_factor, high_freq_factor (llama3). Both equal transformers' ROPE_INIT_FUNCTIONS.
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


ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")
# The further settings of each scaling (transformers' rope_parameters names) and their defaults.
ROPE_PARAMETERS: dict[str, dict[str, object]] = {
    "yarn": {"original_max_position_embeddings": None, "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None,
             "mscale": None, "mscale_all_dim": None, "truncate": True},
    "llama3": {"original_max_position_embeddings": None, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}  # fmt: skip


def check_rope_parameters(scaling: str | None, parameters: dict | None) -> None:
    """One-line ValueError for a rope_parameters key the scaling does not take, or a value out of its range (the
    lengths and turns go into logarithms and divisions)."""
    valid = ROPE_PARAMETERS.get(scaling or "", {})
    unknown = sorted(set(parameters or {}) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown attention.rope_parameters key {unknown[0]!r} for rope_scaling={scaling!r}; valid: "
            f"{', '.join(valid) or 'none'}"
        )
    settings = {**valid, **(parameters or {})}
    original = settings.get("original_max_position_embeddings")
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original <= 0):
        raise ValueError(
            "attention.rope_parameters.original_max_position_embeddings must be a positive int (the trained "
            f"context length; null: the model's own), got {original!r}"
        )
    for key in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor"):
        value = settings.get(key)
        if key in settings and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ValueError(f"attention.rope_parameters.{key} must be a number > 0, got {value!r}")
    if scaling == "llama3" and settings["high_freq_factor"] <= settings["low_freq_factor"]:
        raise ValueError(
            "attention.rope_parameters.high_freq_factor must be larger than low_freq_factor="
            f"{settings['low_freq_factor']!r} (the blend between them divides by the difference), got "
            f"{settings['high_freq_factor']!r}"
        )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 mscale ln(s) + 1 (Peng et al. 2023, eq. 21)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(dim: int, base: float, factor: float, original_length: int, settings: dict) -> tuple:
    """(inverse frequencies, attention factor) of YaRN: NTK-by-parts interpolation (section 3.2)."""
    attention_factor = settings["attention_factor"]
    if attention_factor is None:
        mscale, mscale_all_dim = settings["mscale"], settings["mscale_all_dim"]
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)

    def dimension_of(turns: float) -> float:  # the dimension whose wavelength fits `turns` times in the length
        return dim * math.log(original_length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_of(settings["beta_fast"]), dimension_of(settings["beta_slow"])
    if settings["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = inverse_frequencies(dim, base)
    extrapolated = 1 - ramp  # 1: keep the frequency (fast dimensions), 0: interpolate by the factor
    return (extrapolation / factor) * (1 - extrapolated) + extrapolation * extrapolated, float(attention_factor)


def llama3_frequencies(dim: int, base: float, factor: float, original_length: int, settings: dict) -> torch.Tensor:
    """Llama 3.1's inverse frequencies: long wavelengths interpolated, short ones kept, a smooth blend between."""
    low, high = settings["low_freq_factor"], settings["high_freq_factor"]
    inv_freq = inverse_frequencies(dim, base)
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original_length / low, inv_freq / factor, inv_freq)
    smooth = (original_length / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original_length / high) & (wavelength <= original_length / low)
    return torch.where(medium, blended, scaled)


def inverse_frequencies(dim: int, base: float | torch.Tensor) -> torch.Tensor:
    """RoPE's base^(-2i / dim) for i = 0 .. dim / 2 - 1, float32 (the computation of GPT-NeoX / LLaMA)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half convention (GPT-NeoX / LLaMA).

    Positions are integer tensors of shape (T,) for sequences or (T, n_axes) for axial N-D grids
    (image patches: n_axes=2). With n axes the head dimension is split into n equal parts and each
    part is rotated by its own coordinate, as in axial 2D RoPE for ViTs (Heo et al. 2024).

    `scaling` (linear | ntk | dynamic | yarn | llama3, with `factor` and, for the last two, `parameters`; see the
    module docstring) stretches 1-D RoPE past the `trained_length`. `attention_factor` multiplies cos and sin
    (YaRN's temperature; 1 otherwise). Dynamic scaling depends on the length n = largest position + 1 of each
    call, as in transformers: a decoding step at position p rotates its key with the base of p + 1 tokens, and keys
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
        parameters: dict | None = None,
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
            check_rope_parameters(scaling, parameters)
            settings = {**ROPE_PARAMETERS.get(scaling, {}), **(parameters or {})}
            if settings.get("original_max_position_embeddings", 0) is None:
                settings["original_max_position_embeddings"] = trained_length
            if (
                scaling in ("dynamic", "yarn", "llama3")
                and trained_length is None
                and not settings.get("original_max_position_embeddings")
            ):
                raise ValueError(
                    f"attention.rope_scaling={scaling!r} needs the trained length (TokenLayout.max_length)"
                )
        self.head_dim = head_dim
        self.base = base
        self.n_axes = n_axes
        self.scaling = scaling
        self.factor = factor
        self.trained_length = trained_length
        axis_dim = head_dim // n_axes
        self.attention_factor = 1.0
        if scaling == "ntk":
            self.inv_freq = inverse_frequencies(axis_dim, base * factor ** (axis_dim / (axis_dim - 2)))
        elif scaling == "yarn":
            original = settings["original_max_position_embeddings"]
            self.inv_freq, self.attention_factor = yarn_frequencies(axis_dim, base, factor, original, settings)
        elif scaling == "llama3":
            original = settings["original_max_position_embeddings"]
            self.inv_freq = llama3_frequencies(axis_dim, base, factor, original, settings)
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
            table = self._tables[device] = (angles.cos() * self.attention_factor, angles.sin() * self.attention_factor)
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
            cos, sin = angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
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
    """Adds a learned (max_length, dim) table to (B, T, dim) inputs, starting at `offset`, or at `positions`
    ((B, T) ints, e.g. each token's position inside its packed document)."""

    def __init__(self, dim: int, max_length: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_length, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is not None:
            return x + self.weight[positions]
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
