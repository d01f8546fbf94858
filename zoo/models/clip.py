"""CLIP (Radford et al. 2021): an image tower and a text tower trained to agree in one embedding space.

Image tower: zoo's ViT trunk (class-token pooling; `pre_norm` is OpenAI's ln_pre). Text tower: a causal
pre-norm Transformer read out at the end-of-text token. Both are projected without bias to `embed_dim`
and L2-normalised; their cosine similarities times a learned temperature are the logits of the
contrastive loss (zoo/tasks/contrastive_loss.py).

Both towers are built on zoo's encoder trunk (zoo/nn/encoder.py: blocks and final norm), so the attention
group (full, local, linear, RoPE) applies to both: RoPE replaces the learned position tables (2D axial
positions for image patches, 1D for text). `CLIP.from_huggingface` copies a `transformers` CLIPModel one to
one; `CLIP.from_pretrained` reads one saved to disk.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, TokenLayout
from zoo.models.vit import ViT, ViTConfig
from zoo.nn import Dropout, ModelConfig
from zoo.nn.activations import from_huggingface_activation
from zoo.nn.blocks import set_checkpointing
from zoo.nn.encoder import EncoderTrunk
from zoo.weights import read_weights

TEXT_POOLINGS = ("eot", "argmax")


@dataclass
class TextTransformerConfig(ModelConfig):
    """CLIP's text tower: a causal Transformer read out at the end-of-text token.

    Args:
        vocab_size: token ids.
        max_length: the longest token sequence (the learned position table's size): OpenAI's context_length.
        dim: width of the tokens.
        depth: Transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: hidden width of the MLP; None: 4 * dim.
        dropout: on embeddings, residual branches and MLP hidden units.
        activation: the MLP's activation (zoo/nn/activations.py).
        norm_eps: LayerNorm's epsilon.
        bias: biases in Linear layers and LayerNorms.
        pool: eot (the first position holding eot_token_id) | argmax (the highest token id: OpenAI's original
            rule, whose tokenizer gives end-of-text the last id; Hugging Face configs with eos_token_id=2 keep it).
        eot_token_id: the end-of-text token's id.
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
        attention: the attention of every block (an AttentionConfig, or its dict).
    """

    family: ClassVar[str] = "text"
    sizes: ClassVar[tuple[str, ...]] = ("vocab_size", "max_length", "dim", "depth", "num_heads", "mlp_dim")
    renamed: ClassVar[dict[str, str]] = {"context_length": "max_length"}  # checkpoints written before 2026-12

    vocab_size: int = 512
    max_length: int = 32
    dim: int = 64
    depth: int = 4
    num_heads: int = 4
    mlp_dim: int | None = None
    dropout: float = 0.0
    activation: str = "gelu"
    norm_eps: float = 1e-5
    bias: bool = True
    pool: str = "eot"
    eot_token_id: int = 2
    checkpointing: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool not in TEXT_POOLINGS:
            raise ValueError(f"unknown text pooling {self.pool!r}; valid choices: {list(TEXT_POOLINGS)}")
        if not 0 <= self.eot_token_id < self.vocab_size:
            raise ValueError(f"text.eot_token_id must be in [0, vocab_size={self.vocab_size}), got {self.eot_token_id}")


class TextTransformer(EncoderTrunk):
    """Token + position embeddings -> causal pre-norm blocks -> LayerNorm -> the end-of-text state.

    Causal attention makes the end-of-text state a summary of the whole caption that padding after it
    cannot touch, so no padding mask is needed.
    """

    def __init__(self, config: TextTransformerConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or TextTransformerConfig(**overrides)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.dim)
        relative = config.attention.relative_positions  # RoPE or a position bias: positions act inside attention
        self.pos_embed = None if relative else LearnedPositionalEmbedding(config.dim, config.max_length)
        self.dropout = Dropout(config.dropout)
        # No head: CLIP projects the pooled state (text_projection).
        self.build_trunk(config, TokenLayout(max_length=config.max_length), causal=True, norm_bias=config.bias)
        self._init_weights()

    def _init_weights(self) -> None:
        # OpenAI CLIP's text init: residual projections scaled down with depth (as in GPT-2).
        dim, depth = self.config.dim, self.config.depth
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed.weight, std=0.01)
        residual_std = dim**-0.5 * (2 * depth) ** -0.5
        for block in self.blocks:
            nn.init.normal_(block.self_attn.in_proj.weight, std=dim**-0.5)
            nn.init.normal_(block.self_attn.out_proj.weight, std=residual_std)
            nn.init.normal_(block.mlp.fc1.weight, std=(2 * dim) ** -0.5)
            nn.init.normal_(block.mlp.fc2.weight, std=residual_std)
            for linear in (block.self_attn.in_proj, block.self_attn.out_proj, block.mlp.fc1, block.mlp.fc2):
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)

    @property
    def num_features(self) -> int:
        return self.config.dim

    def forward_features(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> normalised states (B, T, dim)."""
        length = token_ids.shape[1]
        if length > self.config.max_length:
            raise ValueError(f"text of {length} tokens exceeds text.max_length={self.config.max_length}")
        x = self.token_embedding(token_ids)
        if self.pos_embed is not None:
            x = self.pos_embed(x)
        return self.forward_blocks(self.dropout(x))

    def eot_positions(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B,) index of the end-of-text token of each sequence."""
        if self.config.pool == "argmax":
            return token_ids.argmax(dim=-1)
        is_eot = token_ids == self.config.eot_token_id
        if not bool(is_eot.any(dim=-1).all()):
            raise ValueError(f"every text must contain the end-of-text token id {self.config.eot_token_id}")
        return is_eot.int().argmax(dim=-1)  # the first end-of-text

    def pool(self, features: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """(B, T, dim) -> (B, dim): the state at the end-of-text token."""
        rows = torch.arange(features.shape[0], device=features.device)
        return features[rows, self.eot_positions(token_ids)]

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_features(token_ids), token_ids)


@dataclass
class CLIPConfig(ModelConfig):
    """The CLIP dual encoder (Radford et al. 2021): a ViT image tower and a text tower, projected into one space.

    Args:
        embed_dim: width of the shared embedding space.
        image: the image tower, a ViTConfig without a head (num_classes 0); a dict defaults to OpenAI's ln_pre
            (pre_norm) and norm_eps 1e-5.
        text: the text tower, a TextTransformerConfig.
        attention: when set, the attention of both towers (conf/attention); None: each tower's own.
        logit_scale_init: the learned log inverse temperature at the start, ln(1 / 0.07) (section 2.5).
        logit_scale_max: its ceiling, ln(100): logits are never scaled by more than 100.
        checkpointing: activation checkpointing in the blocks of both towers.
    """

    family: ClassVar[str] = "clip"
    sizes: ClassVar[tuple[str, ...]] = ("embed_dim",)

    embed_dim: int = 64
    image: ViTConfig = field(default_factory=lambda: ViTConfig(num_classes=0, pre_norm=True, norm_eps=1e-5))
    text: TextTransformerConfig = field(default_factory=TextTransformerConfig)
    attention: AttentionConfig | None = None
    logit_scale_init: float = math.log(1 / 0.07)
    logit_scale_max: float = math.log(100.0)
    checkpointing: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.image, dict):  # CLIP's defaults for the image tower: OpenAI's ln_pre and eps
            self.image = ViTConfig.from_dict({"pre_norm": True, "norm_eps": 1e-5, **self.image, "num_classes": 0})
        super().__post_init__()
        if self.image.num_classes != 0:
            raise ValueError(
                f"CLIP's image tower has no classifier head: image.num_classes must be 0, got {self.image.num_classes}"
            )
        if self.attention is not None:
            self.image.attention = self.attention
            self.text.attention = self.attention


class CLIP(nn.Module):
    def __init__(self, config: CLIPConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or CLIPConfig(**overrides)
        self.config = config
        self.image_encoder = ViT(config.image)
        self.text_encoder = TextTransformer(config.text)
        if config.checkpointing:
            set_checkpointing(self, True)
        self.image_projection = nn.Linear(config.image.dim, config.embed_dim, bias=False)
        self.text_projection = nn.Linear(config.text.dim, config.embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))
        nn.init.normal_(self.image_projection.weight, std=config.image.dim**-0.5)
        nn.init.normal_(self.text_projection.weight, std=config.text.dim**-0.5)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """(B, C, H, W) -> (B, embed_dim), unit length unless normalize=False."""
        features = self.image_projection(self.image_encoder(images))
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, token_ids: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """(B, T) token ids, each holding an end-of-text token -> (B, embed_dim)."""
        features = self.text_projection(self.text_encoder(token_ids))
        return F.normalize(features, dim=-1) if normalize else features

    def scale(self) -> torch.Tensor:
        """exp(logit_scale), clamped so the logits never exceed 100 x cosine similarity."""
        return self.logit_scale.clamp(max=self.config.logit_scale_max).exp()

    def forward(self, images: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> image embeddings (B, E), text embeddings (B', E), logit scale (); the logits of image i and
        text j are scale * image[i] @ text[j]."""
        return self.encode_image(images), self.encode_text(token_ids), self.scale()

    @classmethod
    def from_huggingface(cls, model: nn.Module, attention: AttentionConfig | dict | None = None) -> CLIP:
        """A zoo CLIP computing what a `transformers` CLIPModel computes, weights copied one to one.

        `attention` swaps the attention of both towers (local, linear, RoPE): a change of architecture
        that keeps every weight (RoPE drops the learned position tables), to be fine-tuned afterwards."""
        state_dict = {key: value.detach() for key, value in model.state_dict().items()}
        clip = cls(config_from_huggingface(model.config, attention))
        load_huggingface_state_dict(clip, state_dict)
        return clip

    @classmethod
    def from_pretrained(cls, path: str | Path, attention: AttentionConfig | dict | None = None) -> CLIP:
        """A Hugging Face CLIPModel saved to disk, read offline. `path` is either a folder written by
        `save_pretrained` (config.json with model.safetensors or pytorch_model.bin, possibly sharded), or
        a state-dict file (`torch.save(model.state_dict())`, .safetensors too) with config.json beside it.
        Tensors are read without executing code (safetensors, or torch.load with weights_only=True)."""
        config_file, weight_files = _locate_pretrained(Path(path))
        clip = cls(config_from_huggingface(_read_huggingface_config(config_file), attention))
        state_dict: dict[str, torch.Tensor] = {}
        for file in weight_files:
            state_dict.update(read_weights(file, "model.pretrained"))
        load_huggingface_state_dict(clip, state_dict)
        return clip


# -- Hugging Face interop --------------------------------------------------------------------------------
# transformers' CLIP is the same network: pre-norm blocks, quick_gelu, ln_pre ("pre_layrnorm") in the
# image tower, the class token through post_layernorm, the end-of-text state through final_layer_norm, and
# projections without bias. Only the names differ, and q/k/v are three matrices instead of one.
_HF_BLOCK_NAMES = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "self_attn.out_proj": "self_attn.out_proj",
}
_HF_NAMES = {
    "image_encoder.cls_token": "vision_model.embeddings.class_embedding",
    "image_encoder.patch_embed.weight": "vision_model.embeddings.patch_embedding.weight",
    "image_encoder.pos_embed": "vision_model.embeddings.position_embedding.weight",
    "image_encoder.norm_pre": "vision_model.pre_layrnorm",
    "image_encoder.norm": "vision_model.post_layernorm",
    "image_encoder.blocks": "vision_model.encoder.layers",
    "text_encoder.token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "text_encoder.pos_embed.weight": "text_model.embeddings.position_embedding.weight",
    "text_encoder.norm": "text_model.final_layer_norm",
    "text_encoder.blocks": "text_model.encoder.layers",
    "image_projection.weight": "visual_projection.weight",
    "text_projection.weight": "text_projection.weight",
    "logit_scale": "logit_scale",
}


def _get(config: Any, key: str) -> Any:
    return config[key] if isinstance(config, dict) else getattr(config, key)


def config_from_huggingface(hf_config: Any, attention: AttentionConfig | dict | None = None) -> CLIPConfig:
    """A zoo CLIPConfig from a `transformers` CLIPConfig (object or its to_dict())."""
    vision, text = _get(hf_config, "vision_config"), _get(hf_config, "text_config")
    eos = _get(text, "eos_token_id")
    image = ViTConfig(
        image_size=_get(vision, "image_size"),
        patch_size=_get(vision, "patch_size"),
        in_channels=_get(vision, "num_channels"),
        num_classes=0,
        dim=_get(vision, "hidden_size"),
        depth=_get(vision, "num_hidden_layers"),
        num_heads=_get(vision, "num_attention_heads"),
        mlp_dim=_get(vision, "intermediate_size"),
        pool="cls",
        activation=from_huggingface_activation(_get(vision, "hidden_act")),
        norm_eps=_get(vision, "layer_norm_eps"),
        pre_norm=True,
    )
    text_config = TextTransformerConfig(
        vocab_size=_get(text, "vocab_size"),
        max_length=_get(text, "max_position_embeddings"),
        dim=_get(text, "hidden_size"),
        depth=_get(text, "num_hidden_layers"),
        num_heads=_get(text, "num_attention_heads"),
        mlp_dim=_get(text, "intermediate_size"),
        activation=from_huggingface_activation(_get(text, "hidden_act")),
        norm_eps=_get(text, "layer_norm_eps"),
        # transformers keeps OpenAI's argmax rule for configs from before its eos_token_id fix (id 2).
        pool="argmax" if eos == 2 else "eot",
        eot_token_id=eos,
    )
    return CLIPConfig(
        embed_dim=_get(hf_config, "projection_dim"),
        image=image,
        text=text_config,
        attention=attention,
        logit_scale_init=_get(hf_config, "logit_scale_init_value"),
    )


def huggingface_sources(zoo_key: str) -> tuple[str, ...]:
    """The transformers CLIPModel parameter(s) behind one zoo CLIP parameter (q, k, v for in_proj)."""
    for prefix in ("image_encoder.blocks.", "text_encoder.blocks."):
        if zoo_key.startswith(prefix):
            index, rest = zoo_key[len(prefix) :].split(".", 1)
            layer = f"{_HF_NAMES[prefix[:-1]]}.{index}"
            module, param = rest.rsplit(".", 1)
            if module == "self_attn.in_proj":
                return tuple(f"{layer}.self_attn.{name}_proj.{param}" for name in ("q", "k", "v"))
            if module not in _HF_BLOCK_NAMES:
                break
            return (f"{layer}.{_HF_BLOCK_NAMES[module]}.{param}",)
    if zoo_key in _HF_NAMES:
        return (_HF_NAMES[zoo_key],)
    module, _, param = zoo_key.rpartition(".")
    if module in _HF_NAMES:
        return (f"{_HF_NAMES[module]}.{param}",)
    raise KeyError(f"no Hugging Face counterpart for CLIP parameter {zoo_key!r}")


def load_huggingface_state_dict(model: CLIP, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy a transformers CLIPModel state dict into `model`. Position tables that RoPE replaces are
    dropped; anything else that does not fit is one ValueError naming the missing and unexpected keys."""
    own = model.state_dict()
    converted, used, missing, wrong_shapes = {}, set(), [], []
    for key, target in own.items():
        sources = huggingface_sources(key)
        absent = [source for source in sources if source not in state_dict]
        if absent:
            missing += absent
            continue
        value = torch.cat([state_dict[source] for source in sources]) if len(sources) > 1 else state_dict[sources[0]]
        if value.numel() != target.numel():
            wrong_shapes.append(f"{sources[0]} {tuple(value.shape)} vs {tuple(target.shape)}")
            continue
        converted[key] = value.reshape(target.shape)  # class token (D,) -> (1, 1, D), position table -> (1, N, D)
        used.update(sources)
    ignorable = {key for key in state_dict if key.endswith("position_ids")}  # transformers' index buffers
    if model.image_encoder.pos_embed is None:  # RoPE replaces the learned position tables
        ignorable.add(_HF_NAMES["image_encoder.pos_embed"])
    if model.text_encoder.pos_embed is None:
        ignorable.add(_HF_NAMES["text_encoder.pos_embed.weight"])
    unexpected = sorted(set(state_dict) - used - ignorable)
    if missing or unexpected or wrong_shapes:
        raise ValueError(
            "weights do not fit this CLIP: "
            + "; ".join(
                f"{label} ({len(keys)}) {sorted(keys)[:6]}{' ...' if len(keys) > 6 else ''}"
                for label, keys in (
                    ("missing keys", missing),
                    ("unexpected keys", unexpected),
                    ("wrong shapes", wrong_shapes),
                )
                if keys
            )
        )
    model.load_state_dict(converted)


def _locate_pretrained(path: Path) -> tuple[Path, list[Path]]:
    """(config.json, weight files) for a save_pretrained folder or a state-dict file beside config.json."""
    if path.is_dir():
        folder = path
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / index_name).is_file():  # a sharded checkpoint
                shards = sorted(set(json.loads((folder / index_name).read_text())["weight_map"].values()))
                weights = [folder / shard for shard in shards]
                break
        else:
            weights = [
                folder / name for name in ("model.safetensors", "pytorch_model.bin") if (folder / name).is_file()
            ][:1]
        if not weights:
            raise FileNotFoundError(f"model.pretrained={str(path)!r} holds no model.safetensors or pytorch_model.bin")
    elif path.is_file():
        folder, weights = path.parent, [path]
    else:
        raise FileNotFoundError(f"model.pretrained={str(path)!r} does not exist")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"model.pretrained={str(path)!r} needs the model's config.json beside it "
            "(transformers' save_pretrained writes it)"
        )
    return config_file, weights


def _read_huggingface_config(config_file: Path) -> Any:
    """transformers fills in the defaults that save_pretrained leaves out of config.json."""
    try:
        from transformers import CLIPConfig as HuggingFaceCLIPConfig
    except ImportError:
        raise ImportError("reading a Hugging Face CLIP config needs `pip install transformers`") from None
    return HuggingFaceCLIPConfig.from_json_file(str(config_file))
