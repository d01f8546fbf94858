"""CLIP (Radford et al. 2021): an image tower and a text tower trained to agree in one embedding space.

Image tower: zoo's ViT trunk (class-token pooling; `pre_norm` is OpenAI's ln_pre). Text tower: a causal
pre-norm Transformer read out at the end-of-text token. Both are projected without bias to `embed_dim`
and L2-normalised; their cosine similarities times a learned temperature are the logits of the
contrastive loss (zoo/tasks/contrastive_loss.py).

Both towers are built on zoo's encoder trunk (zoo/nn/encoder.py: blocks and final norm), so the attention
group (full, local, linear, RoPE) applies to both: RoPE replaces the learned position tables (2D axial
positions for image patches, 1D for text). `CLIP.from_huggingface` copies a `transformers` CLIPModel one to
one; `CLIP.from_pretrained` reads one saved to disk (zoo/models/convert/huggingface.py maps the names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, TokenLayout
from zoo.models.convert import huggingface
from zoo.models.vit import ViT, ViTConfig
from zoo.nn import Dropout, ModelConfig
from zoo.nn.blocks import set_checkpointing
from zoo.nn.encoder import EncoderTrunk

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

    # -- Hugging Face checkpoints (the maps: zoo/models/convert/huggingface.py) --------------------------------

    @classmethod
    def from_huggingface(cls, model: nn.Module, attention: AttentionConfig | dict | None = None) -> CLIP:
        """A zoo CLIP computing what a `transformers` CLIPModel computes, weights copied one to one.

        `attention` swaps the attention of both towers (local, linear, RoPE): a change of architecture
        that keeps every weight (RoPE drops the learned position tables), to be fine-tuned afterwards."""
        state_dict = {key: value.detach() for key, value in model.state_dict().items()}
        return cls._with_huggingface_weights(model.config, state_dict, attention)

    @classmethod
    def from_pretrained(cls, path: str | Path, attention: AttentionConfig | dict | None = None) -> CLIP:
        """A Hugging Face CLIPModel saved to disk, read offline. `path` is either a folder written by
        `save_pretrained` (config.json with model.safetensors or pytorch_model.bin, possibly sharded), or
        a state-dict file (`torch.save(model.state_dict())`, .safetensors too) with config.json beside it.
        Tensors are read without executing code (safetensors, or torch.load with weights_only=True)."""
        config, state_dict = huggingface.read_clip(path)
        return cls._with_huggingface_weights(config, state_dict, attention)

    @classmethod
    def _with_huggingface_weights(cls, config: Any, state_dict: dict, attention: AttentionConfig | dict | None) -> CLIP:
        clip = cls(CLIPConfig(**huggingface.clip_config(config, attention)))
        clip.load_state_dict(huggingface.clip_state_from_huggingface(state_dict, clip.state_dict()))
        return clip
