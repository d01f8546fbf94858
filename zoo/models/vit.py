"""Vision Transformer (Dosovitskiy et al. 2021): patches -> pre-norm Transformer -> pooled head.

Layout follows timm's `forward_features` / `forward_head` split. Every block's attention comes from
zoo.attention; with `attention.rope` the patches get 2D axial rotary positions instead of the
learned table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig
from zoo.blocks import TransformerBlock

POOLINGS = ("cls", "mean")


@dataclass
class ViTConfig:
    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10  # 0: no head (a feature trunk, e.g. CLIP's image tower)
    dim: int = 64
    depth: int = 4
    num_heads: int = 4
    mlp_dim: int | None = None  # default 4 * dim
    pool: str = "cls"
    dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth, linearly increasing over depth up to this rate
    activation: str = "gelu"
    norm_eps: float = 1e-6
    pre_norm: bool = False  # an extra LayerNorm before the blocks (OpenAI CLIP's ln_pre)
    bias: bool = True
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        if self.pool not in POOLINGS:
            raise ValueError(f"unknown ViT pooling {self.pool!r}; valid choices: {list(POOLINGS)}")
        if self.patch_size <= 0 or self.image_size % self.patch_size != 0:
            raise ValueError(
                f"image_size must be divisible by patch_size, got image_size={self.image_size} and "
                f"patch_size={self.patch_size}"
            )

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size


class ViT(nn.Module):
    def __init__(self, config: ViTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or ViTConfig(**overrides)
        self.config = config
        grid = config.grid_size
        self.patch_embed = nn.Conv2d(
            config.in_channels, config.dim, config.patch_size, stride=config.patch_size, bias=not config.pre_norm
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.pool == "cls" else None
        num_tokens = grid * grid + (1 if self.cls_token is not None else 0)
        self.use_rope = config.attention.rope
        self.pos_embed = None if self.use_rope else nn.Parameter(torch.zeros(1, num_tokens, config.dim))
        self.pos_drop = nn.Dropout(config.dropout)
        self.norm_pre = nn.LayerNorm(config.dim, eps=config.norm_eps) if config.pre_norm else nn.Identity()
        drop_rates = torch.linspace(0, config.drop_path, config.depth).tolist()
        self.blocks = nn.ModuleList(
            TransformerBlock(
                config.dim, config.num_heads, config.mlp_dim, config.attention,
                dropout=config.dropout, drop_path=rate, activation=config.activation,
                bias=config.bias, norm_eps=config.norm_eps, rope_axes=2, norm_first=True,
            )
            for rate in drop_rates
        )
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes > 0 else nn.Identity()
        self._init_weights()
        # 2D coordinates for axial RoPE: the class token sits at (0, 0) (no rotation), patches at (r+1, c+1).
        rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        coords = torch.stack([rows.flatten(), cols.flatten()], dim=-1) + 1
        if self.cls_token is not None:
            coords = torch.cat([torch.zeros(1, 2, dtype=coords.dtype), coords])
        self.register_buffer("patch_positions", coords, persistent=False)

    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)  # start from uniform predictions (timm's head init)

    @property
    def num_features(self) -> int:
        return self.config.dim

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> tokens (B, N(+1), dim) with class token and positions added."""
        size = self.config.image_size
        if images.shape[-2:] != (size, size):
            raise ValueError(f"expected images of {size}x{size}, got {tuple(images.shape[-2:])}")
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, dim)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.norm_pre(self.pos_drop(x))

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> normalised tokens (B, N(+1), dim)."""
        x = self.patchify(images)
        positions = self.patch_positions if self.use_rope else None
        for block in self.blocks:
            x = block(x, positions=positions)
        return self.norm(x)

    def pool(self, features: torch.Tensor) -> torch.Tensor:
        """(B, N(+1), dim) -> (B, dim): the class token, or the mean of the patch tokens."""
        return features[:, 0] if self.config.pool == "cls" else features.mean(dim=1)

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> logits (B, num_classes), or pooled features if num_classes == 0."""
        return self.forward_head(self.forward_features(images))

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)


def resample_position_embedding(pos_embed: torch.Tensor, new_grid: int, num_prefix_tokens: int = 1) -> torch.Tensor:
    """Bicubic resampling of a (1, prefix + g*g, dim) table to new_grid x new_grid, prefix tokens kept.

    Fine-tuning at another image size or patch grid (Dosovitskiy et al. 2021, section 3.2)."""
    prefix, grid_tokens = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    old_grid = int(round(grid_tokens.shape[1] ** 0.5))
    if old_grid * old_grid != grid_tokens.shape[1]:
        raise ValueError(f"position table of {grid_tokens.shape[1]} patch tokens is not a square grid")
    if old_grid == new_grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    grid_tokens = grid_tokens.reshape(1, old_grid, old_grid, dim).permute(0, 3, 1, 2)
    grid_tokens = F.interpolate(grid_tokens.float(), size=(new_grid, new_grid), mode="bicubic", align_corners=False)
    grid_tokens = grid_tokens.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid_tokens], dim=1)
