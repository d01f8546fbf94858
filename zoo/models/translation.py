"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017) for translation.

Encoder: self-attention + FFN; decoder: causal self-attention, cross-attention to the encoder, FFN;
residual + LayerNorm after each sublayer (the paper, `norm_first=False`) or before it (pre-norm, with
a final LayerNorm per stack). Source and target share one BPE vocabulary, so one embedding matrix can
serve both sides and the output projection (section 3.4). Every block comes from zoo.nn.blocks, so the
attention config (full, local, linear, RoPE, ALiBi / T5 biases) applies to both self-attentions (a T5
bias shared per stack: one for the encoder, one for the decoder); `encoder_attention` changes the encoder's
self-attention only (e.g. memory-compressed attention, which is bidirectional only); cross-attention is full
unless `cross_attention` names another kernel.

Decoding: the model implements zoo/models/seq2seq.py's interface (start_decoding, decode_step), whose greedy
and beam search run over the decoder's KV cache (`new_caches`), which holds the growing self-attention
keys/values and the encoder keys/values computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, SinusoidalPositionalEmbedding, TokenLayout
from zoo.nn import BlockConfig, Dropout, ModelConfig, transformer_stack

# Tables added to the embeddings (sinusoidal, learned) or positions inside attention (rope, alibi, t5).
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "t5")


@dataclass
class TranslationConfig(ModelConfig):
    """The encoder-decoder Transformer of Vaswani et al. 2017, for translation.

    Args:
        vocab_size: the shared source/target vocabulary (joint BPE).
        dim: width of the tokens.
        encoder_layers: blocks of the encoder.
        decoder_layers: blocks of the decoder.
        num_heads: attention heads per attention.
        mlp_dim: hidden width of the MLP.
        dropout: on embeddings, residual branches, MLP hidden units.
        activation: the MLP's activation (zoo/nn/activations.py).
        norm_first: pre-norm; False: post-norm, as the paper.
        norm_eps: LayerNorm's epsilon.
        positions: sinusoidal | learned (tables added to the embeddings) | rope | alibi | t5 (inside attention;
            attention.rope=true and attention.position_bias select the last three too).
        max_length: the longest source or target sequence (the position tables' size).
        tie_embeddings: one matrix for the source and target embeddings and the output projection.
        cross_attention: the kernel of encoder-decoder attention (a variant with cross-attention: full, linear).
        pad_id: the padding token's id.
        bos_id: the beginning-of-sentence token's id.
        eos_id: the end-of-sentence token's id.
        attention: the self-attention of encoder and decoder (an AttentionConfig, or its dict).
        encoder_attention: settings of `attention` that differ in the encoder's self-attention (e.g.
            {"variant": "compressed"}); the positions (rope, position_bias) stay those of both stacks.
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
    """

    family: ClassVar[str] = "translation"
    sizes: ClassVar[tuple[str, ...]] = (
        "vocab_size", "dim", "encoder_layers", "decoder_layers", "num_heads", "mlp_dim", "max_length",
    )  # fmt: skip
    renamed: ClassVar[dict[str, str]] = {"max_len": "max_length"}  # checkpoints written before 2026-12

    vocab_size: int = 1000
    dim: int = 256
    encoder_layers: int = 3
    decoder_layers: int = 3
    num_heads: int = 8
    mlp_dim: int = 512
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False
    norm_eps: float = 1e-5
    positions: str = "sinusoidal"
    max_length: int = 512
    tie_embeddings: bool = True
    cross_attention: str = "full"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    encoder_attention: dict[str, Any] | None = None
    checkpointing: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown positions {self.positions!r}; valid choices: {list(POSITIONS)}")
        if self.positions in ("alibi", "t5"):
            if self.attention.position_bias not in (None, self.positions):
                raise ValueError(
                    f"positions={self.positions!r} contradicts attention.position_bias="
                    f"{self.attention.position_bias!r}; set one of them"
                )
            self.attention = self.attention.replace(position_bias=self.positions)
        if self.attention.rope or self.positions == "rope":
            # Rotary positions act inside self-attention; no absolute table is added to the embeddings.
            self.positions = "rope"
            self.attention = self.attention.replace(rope=True)
        elif self.attention.position_bias is not None:  # so does a position bias
            self.positions = self.attention.position_bias
        if self.encoder_attention is not None:
            self.encoder_attention = dict(self.encoder_attention)
            for name in ("rope", "position_bias"):
                if name in self.encoder_attention:
                    raise ValueError(
                        f"encoder_attention.{name} is set, but the encoder's positions follow positions / "
                        f"attention.{name} of both stacks; set it there"
                    )
            self.encoder_self_attention()  # one-line errors for bad settings

    def encoder_self_attention(self) -> AttentionConfig:
        """The attention of the encoder's self-attention: `attention` with `encoder_attention` on top."""
        return self.attention.replace(**(self.encoder_attention or {}))


class TranslationTransformer(nn.Module):
    def __init__(self, config: TranslationConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or TranslationConfig(**overrides)
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)  # source (and target when tied)
        self.target_embed = self.embed if c.tie_embeddings else nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)
        self.output = None if c.tie_embeddings else nn.Linear(c.dim, c.vocab_size, bias=False)
        self.embed_scale = math.sqrt(c.dim)  # section 3.4: embeddings are multiplied by sqrt(d_model)
        if c.positions == "sinusoidal":
            table = SinusoidalPositionalEmbedding(c.dim, c.max_length)
            self.source_positions, self.target_positions = table, table
        elif c.positions == "learned":
            self.source_positions = LearnedPositionalEmbedding(c.dim, c.max_length)
            self.target_positions = LearnedPositionalEmbedding(c.dim, c.max_length)
        else:
            self.source_positions = self.target_positions = None
        self.dropout = Dropout(c.dropout)

        encoder_block = BlockConfig(
            dim=c.dim,
            num_heads=c.num_heads,
            mlp_dim=c.mlp_dim,
            attention=c.encoder_self_attention(),
            norm_first=c.norm_first,
            dropout=c.dropout,
            activation=c.activation,
            norm_eps=c.norm_eps,
            layout=TokenLayout(max_length=c.max_length),
            checkpointing=c.checkpointing,
        )
        # The decoder's blocks: causal self-attention with the decoder's options, then cross-attention.
        decoder_block = replace(encoder_block, attention=c.attention, causal=True, cross_attention=c.cross_attention)
        self.encoder = transformer_stack(encoder_block, c.encoder_layers)
        self.decoder = transformer_stack(decoder_block, c.decoder_layers)
        # Pre-norm stacks end un-normalised; post-norm ones already end in a LayerNorm.
        self.encoder_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        # fairseq's Transformer init: Xavier-uniform matrices, N(0, d^-1/2) embeddings, zero padding row.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for embedding in {id(e): e for e in (self.embed, self.target_embed)}.values():
            nn.init.normal_(embedding.weight, std=self.config.dim**-0.5)
            with torch.no_grad():
                embedding.weight[self.config.pad_id].zero_()

    # -- encoder ----------------------------------------------------------------------------------
    def padding_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens == self.config.pad_id

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Source ids (B, S) -> memory (B, S, C)."""
        if src_padding_mask is None:
            src_padding_mask = self.padding_mask(src)
        x = self.embed(src) * self.embed_scale
        if self.source_positions is not None:
            x = self.source_positions(x)
        x = self.dropout(x)
        for block in self.encoder:
            x = block(x, key_padding_mask=src_padding_mask)
        return self.encoder_norm(x)

    # -- decoder ----------------------------------------------------------------------------------
    def new_caches(self) -> list[dict[str, Any]]:
        """Fresh decoding state per decoder layer: {"self": growing KV cache, "cross": encoder KV}."""
        return [block.new_cache() for block in self.decoder]

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_padding_mask: torch.Tensor | None,
        tgt_padding_mask: torch.Tensor | None = None,
        caches: list[dict[str, Any]] | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Target ids (B, T) (only the new ones with `caches`) -> logits (B, T, V).

        tgt_padding_mask is optional: targets are right-padded and the self-attention is causal, so a
        real token never sees a padded one; only padded positions (ignored by the loss) would change.
        With need_weights, also the cross-attention probabilities of every layer, [(B, H, T, S)].
        """
        offset = caches[0]["self"].offset if caches is not None else 0
        x = self.target_embed(tgt) * self.embed_scale
        if self.target_positions is not None:
            x = self.target_positions(x, offset=offset)
        x = self.dropout(x)
        alignments = []
        for i, block in enumerate(self.decoder):
            x = block(
                x,
                key_padding_mask=tgt_padding_mask,
                context=memory,
                context_padding_mask=memory_padding_mask,
                cache=caches[i] if caches is not None else None,
                need_weights=need_weights,
            )
            if need_weights:
                x, weights = x
                alignments.append(weights["cross"])
        x = self.decoder_norm(x)
        logits = F.linear(x, self.target_embed.weight) if self.output is None else self.output(x)
        return (logits, alignments) if need_weights else logits

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: source (B, S) and decoder input (B, T) ids -> next-token logits (B, T, V)."""
        src_padding_mask = self.padding_mask(src)
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask)

    # -- the search interface (zoo/models/seq2seq.py) ---------------------------------------------
    def start_decoding(self, src: torch.Tensor, repeats: int = 1, use_cache: bool = True) -> TransformerSearchState:
        """Encode src (B, S) once; the state of B * repeats rows (row b * repeats + r decodes sentence b)."""
        padding = self.padding_mask(src)
        memory = self.encode(src, padding)
        if repeats > 1:
            memory, padding = memory.repeat_interleave(repeats, dim=0), padding.repeat_interleave(repeats, dim=0)
        return TransformerSearchState(memory, padding, self.new_caches() if use_cache else None)

    def decode_step(self, tokens: torch.Tensor, state: TransformerSearchState) -> torch.Tensor:
        """Logits (N, V) of the token after the prefix tokens (N, t): the caches see only the tokens they have not
        seen, without caches the whole prefix is decoded again."""
        inputs = tokens[:, state.caches[0]["self"].offset :] if state.caches is not None else tokens
        return self.decode(inputs, state.memory, state.memory_padding_mask, caches=state.caches)[:, -1]

    @torch.no_grad()
    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Per decoder layer, the cross-attention probabilities (B, H, T, S) of target ids tgt (B, T)."""
        src_padding_mask = self.padding_mask(src)
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask, need_weights=True)[1]


class TransformerSearchState:
    """The Transformer's decoding state: the encoder memory and its padding, and the decoder's caches (or None)."""

    def __init__(
        self, memory: torch.Tensor, memory_padding_mask: torch.Tensor, caches: list[dict[str, Any]] | None
    ) -> None:
        self.memory, self.memory_padding_mask, self.caches = memory, memory_padding_mask, caches

    def reorder(self, indices: torch.Tensor) -> None:
        self.memory = self.memory.index_select(0, indices)
        self.memory_padding_mask = self.memory_padding_mask.index_select(0, indices)
        for layer in self.caches or ():
            for cache in layer.values():
                cache.reorder(indices)
