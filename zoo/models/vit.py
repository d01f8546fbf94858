"""Vision Transformer (Dosovitskiy et al. 2021): patches -> pre-norm Transformer -> pooled head.

The patch embedding is one strided convolution (`stem: patch`), or with `stem: conv` the convolutional stem of
Xiao et al. 2021 ("Early Convolutions Help Transformers See Better", section 3.2): log2(patch_size) 3x3 convolutions
of stride 2, each with BatchNorm and ReLU, the channels doubling up to the width, then a 1x1 convolution to
the width; the same token grid, for a few percent more compute, and a network that trains faster and more
stably on small data. Its BatchNorm normalises a training batch by its own statistics (under DDP: each rank's
share; Lightning's `trainer.sync_batchnorm=true` syncs them on GPUs) and uses running statistics in eval.

Layout follows timm's `forward_features` / `forward_head` split. Blocks, final norm, pooling and head are
the encoder trunk every zoo encoder shares (zoo/nn/encoder.py); every block's attention comes from
zoo.attention; with `attention.rope` the patches get 2D axial rotary positions instead of the
learned table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig, TokenLayout
from zoo.models.convert.torchvision import (
    is_torchvision_vit,
    vit_architecture,
    vit_state_from_torchvision,
    vit_trunk_from_torchvision,
)
from zoo.nn import Dropout, ModelConfig
from zoo.nn.encoder import POOLINGS, EncoderTrunk, pool_tokens
from zoo.weights import read_weights

STEMS = ("patch", "conv")


def conv_stem(in_channels: int, dim: int, patch_size: int, bias: bool = True) -> nn.Sequential:
    """Xiao et al. 2021's stem for a patch_size x patch_size grid: per halving a 3x3 stride-2 convolution,
    BatchNorm and ReLU, with dim / 2^(k-1), ..., dim / 2, dim channels for k halvings (their ViT-1GF stem:
    24, 48, 96, 192 for width 192), then a 1x1 convolution to the width."""
    halvings = patch_size.bit_length() - 1
    layers: list[nn.Module] = []
    channels = in_channels
    for index in range(halvings):
        out = max(1, dim >> (halvings - 1 - index))
        layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
        channels = out
    layers.append(nn.Conv2d(channels, dim, 1, bias=bias))
    return nn.Sequential(*layers)


@dataclass
class ViTConfig(ModelConfig):
    """The Vision Transformer's architecture (Dosovitskiy et al. 2021).

    Args:
        image_size: side of the square input image, in pixels.
        patch_size: side of a patch; image_size must be a multiple of it.
        in_channels: channels of the input image.
        num_classes: classes of the head; 0: no head (a feature trunk, e.g. CLIP's image tower).
        dim: width of the tokens.
        depth: Transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: hidden width of the MLP; None: 4 * dim.
        pool: cls (the class token) | mean (of the patch tokens).
        stem: patch (one strided convolution) | conv (Xiao et al. 2021's convolutional stem; patch_size a power of 2).
        dropout: on embeddings, residual branches and MLP hidden units.
        drop_path: stochastic depth, increasing linearly over depth up to this rate.
        activation: the MLP's activation (zoo/nn/activations.py).
        norm_eps: LayerNorm's epsilon.
        pre_norm: an extra LayerNorm before the blocks (OpenAI CLIP's ln_pre).
        bias: biases in Linear layers and LayerNorms.
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
        attention: the attention of every block (an AttentionConfig, or its dict).
    """

    family: ClassVar[str] = "vit"
    sizes: ClassVar[tuple[str, ...]] = (
        "image_size",
        "patch_size",
        "in_channels",
        "dim",
        "depth",
        "num_heads",
        "mlp_dim",
    )

    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    dim: int = 64
    depth: int = 4
    num_heads: int = 4
    mlp_dim: int | None = None
    pool: str = "cls"
    stem: str = "patch"
    dropout: float = 0.0
    drop_path: float = 0.0
    activation: str = "gelu"
    norm_eps: float = 1e-6
    pre_norm: bool = False
    bias: bool = True
    checkpointing: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool not in POOLINGS:
            raise ValueError(f"unknown ViT pooling {self.pool!r}; valid choices: {list(POOLINGS)}")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise ValueError(f"vit num_classes must be an int >= 0 (0: no head), got {self.num_classes!r}")
        if self.stem not in STEMS:
            raise ValueError(f"unknown ViT stem {self.stem!r}; valid choices: {list(STEMS)}")
        if self.stem == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(
                "stem 'conv' reaches the patch grid by halving the image with stride-2 convolutions, so patch_size "
                f"must be a power of 2 >= 2, got patch_size={self.patch_size}; valid: 2, 4, 8, 16, ... or stem='patch'"
            )
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"image_size must be divisible by patch_size, got image_size={self.image_size} and "
                f"patch_size={self.patch_size}"
            )

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size


class ViT(EncoderTrunk):
    def __init__(self, config: ViTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or ViTConfig(**overrides)
        self.config = config
        grid = config.grid_size
        if config.stem == "conv":
            self.patch_embed = conv_stem(config.in_channels, config.dim, config.patch_size, bias=not config.pre_norm)
        else:
            self.patch_embed = nn.Conv2d(
                config.in_channels, config.dim, config.patch_size, stride=config.patch_size, bias=not config.pre_norm
            )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.pool == "cls" else None
        prefix = 1 if self.cls_token is not None else 0
        layout = TokenLayout(max_length=prefix + grid * grid, grid=(grid, grid), prefix_tokens=prefix)
        # With RoPE, the patches get 2-D rotary positions inside attention (from the layout's grid) instead.
        self.pos_embed = None if config.attention.rope else nn.Parameter(torch.zeros(1, layout.max_length, config.dim))
        self.pos_drop = Dropout(config.dropout)
        self.norm_pre = nn.LayerNorm(config.dim, eps=config.norm_eps) if config.pre_norm else nn.Identity()
        self.build_trunk(config, layout)
        self._init_weights()

    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        self.init_linear_layers()

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
        return self.forward_blocks(self.patchify(images))

    @torch.no_grad()
    def attention_weights(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Per block, the attention probabilities (B, H, N(+1), N(+1)) the kernel effectively applies (zeros
        where it does not attend); token 0 is the class token when pool='cls'. For inspection: slower."""
        x, weights = self.patchify(images), []
        for block in self.blocks:
            x, attention = block(x, need_weights=True)
            weights.append(attention["self"])
        return weights

    def pool(self, features: torch.Tensor) -> torch.Tensor:
        """(B, N(+1), dim) -> (B, dim): the class token, or the mean of the patch tokens."""
        return pool_tokens(features, self.config.pool)

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> logits (B, num_classes), or pooled features if num_classes == 0."""
        return self.forward_head(self.forward_features(images))

    @classmethod
    def from_torchvision(
        cls, reference: nn.Module, image_size: int | None = None, num_classes: int | None = None, **overrides: Any
    ) -> ViT:
        """A zoo ViT equal to a torchvision `VisionTransformer` (any size); optionally at another image
        size (positions resampled) or class count (new head). `overrides` set other ViTConfig fields,
        e.g. attention={"variant": "linear"} (a change of architecture: fine-tune afterwards). The names are
        mapped in zoo/models/convert/torchvision.py."""
        state_dict = {k: v.detach() for k, v in reference.state_dict().items()}
        arch = vit_architecture(state_dict)
        arch["num_heads"] = reference.encoder.layers[0].self_attention.num_heads
        arch["image_size"] = image_size or reference.image_size
        head = state_dict.get("heads.head.weight")
        arch["num_classes"] = num_classes if num_classes is not None else (head.shape[0] if head is not None else 0)
        model = cls(ViTConfig(**{**arch, "norm_eps": 1e-6, "activation": "gelu", "pool": "cls", **overrides}))
        load_reference_weights(model, vit_state_from_torchvision(state_dict))
        return model


def attention_rollout(weights: list[torch.Tensor], residual: bool = True) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1): how much each token's final state draws on each input
    token, through all layers. Per layer the heads are averaged and, with `residual`, the skip connection is
    added as an identity (0.5 A + 0.5 I), rows renormalised; the layers' matrices are then multiplied from
    the first up. weights: per layer (B, H, N, N) -> (B, N, N), every row summing to 1. Weights that are not
    probabilities (memory-compressed attention's effective weights of the values may be negative) enter by
    magnitude, so that every layer's matrix stays row-stochastic."""
    if not weights:
        raise ValueError("attention rollout needs the attention weights of at least one layer")
    rollout = None
    for layer in weights:
        attention = layer.float().abs().mean(dim=1)  # (B, N, N)
        if residual:
            attention = 0.5 * attention + 0.5 * torch.eye(attention.shape[-1], device=attention.device)
        attention = attention / attention.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        rollout = attention if rollout is None else attention @ rollout
    return rollout


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


def load_reference_weights(model: ViT, state_dict: dict[str, torch.Tensor]) -> list[str]:
    """Load zoo-named weights into `model`, adapting what fine-tuning changes.

    Position tables are resampled to the model's grid; a classifier head of another class count and
    weights the architecture no longer has (a position table under RoPE, a class token under mean
    pooling: a change of architecture) are left out. Returns notes on what was adapted; any other
    mismatch is one ValueError naming the missing and unexpected keys.
    """
    notes, state_dict = [], dict(state_dict)
    own = model.state_dict()
    if "pos_embed" in state_dict:
        if model.pos_embed is None:
            notes.append("dropped the learned position table (RoPE replaces it)")
            del state_dict["pos_embed"]
        else:
            prefix = 1 if "cls_token" in state_dict else 0
            table = state_dict["pos_embed"]
            if model.cls_token is None and prefix:
                table = table[:, 1:]
                prefix = 0
            resampled = resample_position_embedding(table, model.config.grid_size, prefix)
            if resampled.shape != table.shape:
                notes.append(f"resampled positions {tuple(table.shape)} -> {tuple(resampled.shape)} (bicubic)")
            state_dict["pos_embed"] = resampled
    if "cls_token" in state_dict and model.cls_token is None:
        notes.append("dropped the class token (mean pooling)")
        del state_dict["cls_token"]
    head_keys = [key for key in state_dict if key.startswith("head.")]
    if head_keys and any(state_dict[k].shape != own.get(k, state_dict[k]).shape or k not in own for k in head_keys):
        notes.append("new classifier head (different number of classes)")
        for key in head_keys:
            del state_dict[key]
    missing = sorted(set(own) - set(state_dict) - {k for k in own if k.startswith("head.")})
    unexpected = sorted(set(state_dict) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"pretrained weights do not fit this ViT: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}"
        )
    shapes = [k for k in state_dict if state_dict[k].shape != own[k].shape]
    if shapes:
        raise ValueError(f"pretrained weights do not fit this ViT: shape mismatch at {shapes[:8]}")
    model.load_state_dict(state_dict, strict=False)
    return notes


def vit_from_pretrained(path: str, config: ViTConfig) -> tuple[ViT, list[str]]:
    """Build a ViT for `config` from a torchvision state dict or a zoo checkpoint at `path`.

    torchvision weights define the trunk (dim, depth, MLP, patch size; the head count of torchvision's named
    widths, else `config.num_heads`); `config` keeps the image size, channels (RGB weights are summed for
    grayscale data), classes, pooling, attention and regularisation of the new task."""
    state_dict = read_weights(path, "model.pretrained")
    notes = []
    if is_torchvision_vit(state_dict):
        arch, state_dict, notes = vit_trunk_from_torchvision(state_dict, config)
        changed = {k: v for k, v in arch.items() if getattr(config, k) != v}
        if changed:
            notes.append(f"architecture from the pretrained weights: {changed}")
            config = ViTConfig.from_dict({**config.to_dict(), **arch})
    model = ViT(config)
    notes += load_reference_weights(model, state_dict)
    return model, notes
