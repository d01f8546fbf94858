"""The trunk zoo's encoders share: pre-norm Transformer blocks, the final LayerNorm, pooling, a linear head.

ViT (image patches), CLIP's text tower (caption tokens) and the sequence classifier (pixel or ListOps tokens)
differ only in how they turn their input into token vectors. Each subclasses `EncoderTrunk` and calls
`build_trunk`, which registers `blocks`, `norm` and `head` on the model itself: parameter names carry no extra
prefix, so checkpoints and the torchvision / Hugging Face weight imports see the same names as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.attention import PackedDocuments, TokenLayout
from zoo.nn.blocks import BlockConfig, transformer_stack

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

    def build_trunk(self, config: Any, layout: TokenLayout, *, causal: bool = False, norm_bias: bool = True) -> None:
        """The trunk from an encoder config's shared fields (one name per idea across the families): dim, depth,
        num_heads, mlp_dim, attention, dropout, activation, bias, norm_eps, and where the family has them
        drop_path (stochastic depth rising linearly over the blocks to it; default 0) and num_classes (the head;
        default 0: none, the pooled features are the output). The final LayerNorm has a bias unless
        norm_bias=False (timm's and torchvision's ViTs keep it whatever the blocks do)."""
        drop_rates = torch.linspace(0, getattr(config, "drop_path", 0.0), config.depth).tolist()
        block = BlockConfig(
            dim=config.dim,
            num_heads=config.num_heads,
            mlp_dim=config.mlp_dim,
            attention=config.attention,
            causal=causal,
            dropout=config.dropout,
            activation=config.activation,
            bias=config.bias,
            norm_eps=config.norm_eps,
            layout=layout,
            norm_first=True,
            checkpointing=getattr(config, "checkpointing", False),
        )
        self.blocks = transformer_stack(block, config.depth, drop_path=drop_rates)
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps, bias=norm_bias)
        num_classes = getattr(config, "num_classes", 0)
        self.head = nn.Linear(config.dim, num_classes) if num_classes > 0 else nn.Identity()

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

    def forward_blocks(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, documents: PackedDocuments | None = None
    ) -> torch.Tensor:
        """Embedded tokens (B, T, dim) -> normalised features (B, T, dim); key_padding_mask (B, T), True = pad;
        documents: the rows pack several sequences (zoo/attention/documents.py)."""
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask, documents=documents)
        return self.norm(x)
