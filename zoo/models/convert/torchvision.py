"""torchvision checkpoints as zoo models: `torchvision.models.VisionTransformer` as zoo's ViT.

The two are the same network (pre-norm blocks, class token, learned positions, LayerNorm eps 1e-6); only the
parameter names differ. The architecture is read off the weights: every size but the head count, which only
torchvision's named widths tell. Pure dicts and state dicts; ViT.from_torchvision and vit_from_pretrained
(zoo/models/vit.py) build the model.
"""

from __future__ import annotations

from typing import Any

import torch

RENAMES = (
    ("class_token", "cls_token"),
    ("conv_proj.", "patch_embed."),
    ("encoder.pos_embedding", "pos_embed"),
    ("encoder.ln.", "norm."),
    ("heads.head.", "head."),
    (".ln_1.", ".norm1."),
    (".ln_2.", ".norm2."),
    (".self_attention.in_proj_weight", ".self_attn.in_proj.weight"),
    (".self_attention.in_proj_bias", ".self_attn.in_proj.bias"),
    (".self_attention.out_proj.", ".self_attn.out_proj."),
    (".mlp.0.", ".mlp.fc1."),
    (".mlp.3.", ".mlp.fc2."),
    ("encoder.layers.encoder_layer_", "blocks."),
)

# Heads of torchvision's named sizes (the head count is not recoverable from weights alone).
HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def is_torchvision_vit(state_dict: dict[str, torch.Tensor]) -> bool:
    """The weights are torchvision's (its patch embedding's name), not a zoo ViT's."""
    return "conv_proj.weight" in state_dict


def vit_state_from_torchvision(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchvision VisionTransformer parameter names -> zoo ViT names."""
    if any(key.startswith("heads.pre_logits") for key in state_dict):
        raise ValueError("torchvision ViTs with a representation_size (pre_logits) layer are not supported")
    converted = {}
    for key, value in state_dict.items():
        for old, new in RENAMES:
            key = key.replace(old, new)
        converted[key] = value
    return converted


def vit_architecture(state_dict: dict[str, torch.Tensor]) -> dict[str, int | str | None]:
    """dim, depth, mlp_dim, patch_size, num_heads, in_channels and image_size read off torchvision weights (and
    their stem: a patch embedding).
    num_heads is known only for torchvision's named widths (None otherwise: weights do not record it)."""
    dim, in_channels, patch_size, _ = state_dict["conv_proj.weight"].shape
    depth = len({key.split(".")[2] for key in state_dict if key.startswith("encoder.layers.")})
    grid = round((state_dict["encoder.pos_embedding"].shape[1] - 1) ** 0.5)
    return {
        "dim": dim,
        "depth": depth,
        "mlp_dim": state_dict["encoder.layers.encoder_layer_0.mlp.0.weight"].shape[0],
        "patch_size": patch_size,
        "num_heads": HEADS.get(dim),
        "in_channels": in_channels,
        "image_size": grid * patch_size,
        "stem": "patch",
    }


def adapt_patch_embedding(state_dict: dict[str, torch.Tensor], in_channels: int) -> tuple[dict, list[str]]:
    """RGB patch-embedding weights for grayscale images: summed over the colour channels (as timm's
    adapt_input_conv), so a gray image gives what the RGB network gives for that image in all three channels.
    Other channel changes are refused."""
    weight = state_dict["conv_proj.weight"]  # (dim, C, patch, patch)
    if weight.shape[1] == in_channels:
        return state_dict, []
    if in_channels != 1:
        raise ValueError(
            f"model.pretrained has {weight.shape[1]}-channel patch weights, but the data has {in_channels} "
            "channels (data.in_channels); valid: data of the same channels, or 1 (the colour weights are summed)"
        )
    adapted = {**state_dict, "conv_proj.weight": weight.sum(dim=1, keepdim=True)}
    return adapted, [f"summed the {weight.shape[1]}-channel patch-embedding weights for 1-channel images"]


def vit_trunk_from_torchvision(
    state_dict: dict[str, torch.Tensor], config: Any
) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[str]]:
    """(ViTConfig fields the weights fix, zoo-named weights, notes) for fine-tuning torchvision weights in a ViT of
    `config` (a ViTConfig): the weights define the trunk (dim, depth, MLP, patch size; the head count of
    torchvision's named widths, else config.num_heads); the config keeps the image size and the channels (RGB
    weights are summed for grayscale data)."""
    arch = vit_architecture(state_dict)
    arch.pop("image_size")
    state_dict, notes = adapt_patch_embedding(state_dict, config.in_channels)
    arch["in_channels"] = config.in_channels
    if arch["num_heads"] is None:  # not one of torchvision's sizes: the head count is the config's
        if arch["dim"] % config.num_heads:
            raise ValueError(
                f"model.pretrained has width {arch['dim']}, not one of torchvision's named sizes, so its head "
                f"count is unknown, and model.net.num_heads={config.num_heads} does not divide it; set "
                "model.net.num_heads to the head count the weights were trained with"
            )
        arch["num_heads"] = config.num_heads
        notes.append(
            f"width {arch['dim']} is not a torchvision size: num_heads={config.num_heads} from model.net.num_heads "
            "(it must be the head count the weights were trained with)"
        )
    return arch, vit_state_from_torchvision(state_dict), notes
