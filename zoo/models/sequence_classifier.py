"""A Transformer encoder that classifies token sequences: the model of the long-range tasks (Long Range Arena,
Tay et al. 2021: pixel sequences as LRA's "Image", ListOps).

Token embedding + learned positions (none with RoPE: rotary positions inside attention) -> the encoder trunk
the ViT and CLIP's text tower share (zoo/nn/encoder.py: bidirectional pre-norm blocks, final LayerNorm) ->
pooling (a class token, or the mean of the non-padding tokens) -> a linear head. Tokens equal to
`padding_id` are masked out of attention and pooling. Any attention variant of zoo.attention works; the
layout tells it the longest sequence (class token included). Packed documents (document_ids): several sequences
per row, each attending within itself and pooled by its own mean (pool=mean; a class token per document would
change the row's length), one row of logits per document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, PackedDocuments, TokenLayout
from zoo.nn import POOLINGS, Dropout, EncoderTrunk, ModelConfig, pool_tokens


@dataclass
class SequenceClassifierConfig(ModelConfig):
    """A Transformer encoder over token sequences, classified from its class token or mean (the long-range tasks).

    Args:
        vocab_size: token ids: 256 8-bit pixel values for LRA's Image task, ListOps' 16 symbols.
        max_length: the longest sequence, without the class token.
        num_classes: classes of the head.
        padding_id: the token id of padding (masked out of attention and pooling); None: never padded.
        dim: width of the tokens.
        depth: Transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: hidden width of the MLP; None: 4 * dim.
        pool: cls (the class token) | mean (over the non-padding tokens).
        dropout: on embeddings, residual branches and MLP hidden units.
        drop_path: stochastic depth, increasing linearly over depth up to this rate.
        activation: the MLP's activation (zoo/nn/activations.py).
        norm_eps: LayerNorm's epsilon.
        bias: biases in Linear layers and LayerNorms.
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
        attention: the attention of every block (an AttentionConfig, or its dict).
    """

    family: ClassVar[str] = "sequence_classifier"
    sizes: ClassVar[tuple[str, ...]] = (
        "vocab_size",
        "max_length",
        "num_classes",
        "dim",
        "depth",
        "num_heads",
        "mlp_dim",
    )

    vocab_size: int = 256
    max_length: int = 784
    num_classes: int = 10
    padding_id: int | None = None
    dim: int = 64
    depth: int = 2
    num_heads: int = 4
    mlp_dim: int | None = None
    pool: str = "cls"
    dropout: float = 0.0
    drop_path: float = 0.0
    activation: str = "gelu"
    norm_eps: float = 1e-5
    bias: bool = True
    checkpointing: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool not in POOLINGS:
            raise ValueError(f"unknown sequence_classifier pooling {self.pool!r}; valid choices: {list(POOLINGS)}")
        if self.padding_id is not None and not 0 <= self.padding_id < self.vocab_size:
            raise ValueError(
                f"sequence_classifier padding_id must be null or in [0, vocab_size={self.vocab_size}), "
                f"got {self.padding_id}"
            )


class SequenceClassifier(EncoderTrunk):
    def __init__(self, config: SequenceClassifierConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or SequenceClassifierConfig(**overrides)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.pool == "cls" else None
        prefix = 1 if self.cls_token is not None else 0
        layout = TokenLayout(max_length=prefix + config.max_length, prefix_tokens=prefix)
        self.pos_embed = None if config.attention.rope else LearnedPositionalEmbedding(config.dim, layout.max_length)
        self.dropout = Dropout(config.dropout)
        self.build_trunk(config, layout, norm_bias=config.bias)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed.weight, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        self.init_linear_layers()

    def padding_mask(self, token_ids: torch.Tensor) -> torch.Tensor | None:
        """(B, T) ids -> (B, T) bool, True where the token is padding (None when the config has no padding)."""
        if self.config.padding_id is None:
            return None
        return token_ids == self.config.padding_id

    def forward_features(
        self, token_ids: torch.Tensor, documents: PackedDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) ids -> normalised states (B, T(+1), dim) and their padding mask (B, T(+1)) or None; `documents`:
        the rows pack several sequences (no class token then)."""
        length = token_ids.shape[1]
        if length > self.config.max_length:
            raise ValueError(
                f"sequence of {length} tokens exceeds sequence_classifier max_length={self.config.max_length}"
            )
        mask = self.padding_mask(token_ids)
        x = self.token_embedding(token_ids)  # (B, T, dim)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_zeros(mask.shape[0], 1), mask], dim=1)
        if self.pos_embed is not None:
            x = self.pos_embed(x, positions=None if documents is None else documents.positions)
        return self.forward_blocks(self.dropout(x), key_padding_mask=mask, documents=documents), mask

    def forward(self, token_ids: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> logits (B, num_classes); with document_ids (B, T), each row packs several sequences
        (a new one wherever the id changes) -> logits (documents, num_classes), the documents in token order."""
        if document_ids is None:
            features, mask = self.forward_features(token_ids)
            return self.head(pool_tokens(features, self.config.pool, mask))
        if self.config.pool != "mean":
            raise ValueError(
                f"packed sequences are pooled per document by their mean: set pool=mean (model.net.pool=mean), "
                f"got pool={self.config.pool!r}"
            )
        documents = PackedDocuments.from_ids(document_ids)
        features, mask = self.forward_features(token_ids, documents)
        return self.head(documents.mean(features, mask))
