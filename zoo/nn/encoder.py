"""The trunk zoo's encoders share: pre-norm Transformer blocks, the final LayerNorm, pooling, a linear head.

ViT (image patches), CLIP's text tower (caption tokens) and the sequence classifier (pixel or ListOps tokens)
differ only in how they turn their input into token vectors. Each subclasses `EncoderTrunk` and calls
`build_trunk`, which registers `blocks`, `norm` and `head` on the model itself: parameter names carry no extra
prefix, so checkpoints and the torchvision / Hugging Face weight imports see the same names as before.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.attention import AttentionConfig, TokenLayout
from zoo.nn.blocks import TransformerBlock

POOLINGS = ("cls", "mean")


def pool_tokens(features: torch.Tensor, pool: str, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, dim) -> (B, dim): the first token (a class token), or the mean over the tokens that are not
    padding (key_padding_mask (B, T) bool, True = padding)."""
    if pool == "cls":
        return features[:, 0]
    if pool != "mean":
        raise ValueError(f"unknown pooling {pool!r}; valid choices: {list(POOLINGS)}")
    if key_padding_mask is None:
        return features.mean(dim=1)
    keep = (~key_padding_mask).unsqueeze(-1).to(features.dtype)  # (B, T, 1)
    return (features * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)


class EncoderTrunk(nn.Module):
    """Base of the encoders: `build_trunk` in the subclass's __init__, `forward_blocks` on embedded tokens."""

    blocks: nn.ModuleList
    norm: nn.LayerNorm
    head: nn.Module

    def build_trunk(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_dim: int | None,
        attention: AttentionConfig,
        layout: TokenLayout,
        *,
        causal: bool = False,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
        norm_eps: float = 1e-5,
        norm_bias: bool = True,
        num_classes: int = 0,
    ) -> None:
        """`depth` pre-norm blocks (stochastic depth rising linearly to `drop_path`), the final LayerNorm (with a
        bias unless norm_bias=False, as timm's and torchvision's ViTs keep it whatever the blocks do) and a
        linear head to num_classes (0: no head, the pooled features are the output)."""
        drop_rates = torch.linspace(0, drop_path, depth).tolist()
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                num_heads,
                mlp_dim,
                attention,
                causal=causal,
                dropout=dropout,
                drop_path=rate,
                activation=activation,
                bias=bias,
                norm_eps=norm_eps,
                layout=layout,
                norm_first=True,
            )
            for rate in drop_rates
        )
        self.norm = nn.LayerNorm(dim, eps=norm_eps, bias=norm_bias)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def init_linear_layers(self) -> None:
        """timm's ViT init: every Linear ~ truncated N(0, 0.02) with zero bias, the head at zero (uniform
        predictions at the start)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)

    def forward_blocks(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Embedded tokens (B, T, dim) -> normalised features (B, T, dim); key_padding_mask (B, T), True = pad."""
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask)
        return self.norm(x)
