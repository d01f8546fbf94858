"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017) for translation.

Encoder: self-attention + FFN; decoder: causal self-attention, cross-attention to the encoder, FFN;
residual + LayerNorm after each sublayer (the paper, `norm_first=False`) or before it (pre-norm, with
a final LayerNorm per stack). Source and target share one BPE vocabulary, so one embedding matrix can
serve both sides and the output projection (section 3.4). Every block comes from zoo.nn.blocks, so the
attention config (full, local, linear, RoPE, ALiBi / T5 biases) applies to both self-attentions (a T5
bias shared per stack: one for the encoder, one for the decoder); `encoder_attention` changes the encoder's
self-attention only (e.g. memory-compressed attention, which is bidirectional only); cross-attention is full
unless `cross_attention` names another kernel.

Decoding lives here too: greedy and beam search over the decoder's KV cache (`new_caches`), which
holds the growing self-attention keys/values and the encoder keys/values computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, SinusoidalPositionalEmbedding, TokenLayout
from zoo.nn import Dropout, ModelConfig, transformer_stack

# Tables added to the embeddings (sinusoidal, learned) or positions inside attention (rope, alibi, t5).
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "t5")


@dataclass
class TranslationConfig(ModelConfig):
    family: ClassVar[str] = "translation"
    sizes: ClassVar[tuple[str, ...]] = (
        "vocab_size", "dim", "encoder_layers", "decoder_layers", "num_heads", "mlp_dim", "max_length",
    )  # fmt: skip
    renamed: ClassVar[dict[str, str]] = {"max_len": "max_length"}  # checkpoints written before 2026-12

    vocab_size: int = 1000  # shared source/target vocabulary (joint BPE)
    dim: int = 256
    encoder_layers: int = 3
    decoder_layers: int = 3
    num_heads: int = 8
    mlp_dim: int = 512
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False  # the paper is post-norm
    norm_eps: float = 1e-5
    # sinusoidal | learned | rope | alibi | t5; attention.rope=true / attention.position_bias also select the last three
    positions: str = "sinusoidal"
    max_length: int = 512  # longest source or target sequence (position tables)
    tie_embeddings: bool = True  # one matrix for source, target and output projection
    cross_attention: str = "full"  # kernel of encoder-decoder attention
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # Settings of `attention` that differ in the encoder's self-attention (e.g. {"variant": "compressed"}); the
    # positions (rope, position_bias) stay those of both stacks.
    encoder_attention: dict[str, Any] | None = None
    checkpointing: bool = False  # activation checkpointing per block: recompute in the backward, less memory

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

        def stack(depth: int, decoder: bool) -> nn.ModuleList:
            return transformer_stack(
                depth,
                c.dim,
                c.num_heads,
                c.attention if decoder else c.encoder_self_attention(),
                causal=decoder,
                mlp_dim=c.mlp_dim,
                cross_attention=decoder,
                cross_attention_variant=c.cross_attention,
                norm_first=c.norm_first,
                dropout=c.dropout,
                activation=c.activation,
                norm_eps=c.norm_eps,
                layout=TokenLayout(max_length=c.max_length),
                checkpointing=c.checkpointing,
            )

        self.encoder = stack(c.encoder_layers, decoder=False)
        self.decoder = stack(c.decoder_layers, decoder=True)
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

    @torch.no_grad()
    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Per decoder layer, the cross-attention probabilities (B, H, T, S) of target ids tgt (B, T)."""
        src_padding_mask = self.padding_mask(src)
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask, need_weights=True)[1]


# -- decoding -------------------------------------------------------------------------------------
def _max_lengths(model: TranslationTransformer, src: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """Most target tokens (EOS included) per sentence: a * source length + b, within the position table."""
    source_lengths = (~model.padding_mask(src)).sum(dim=1)
    limits = (max_len_a * source_lengths.float() + max_len_b).long()
    return limits.clamp(min=1, max=model.config.max_length - 1)


def _next_token_logprobs(
    model: TranslationTransformer, logits: torch.Tensor, step: int, limits: torch.Tensor
) -> torch.Tensor:
    """log p(next token) (N, V); never PAD or BOS, and EOS once a sentence reaches its length limit."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
    logprobs[:, model.config.pad_id] = float("-inf")
    logprobs[:, model.config.bos_id] = float("-inf")
    at_limit = step + 1 >= limits
    if at_limit.any():
        eos = logprobs[at_limit, model.config.eos_id]
        logprobs[at_limit] = float("-inf")
        logprobs[at_limit, model.config.eos_id] = eos
    return logprobs


def _step_logits(
    model: TranslationTransformer,
    tokens: torch.Tensor,
    memory: torch.Tensor,
    memory_padding_mask: torch.Tensor,
    caches: list[dict[str, Any]] | None,
) -> torch.Tensor:
    """Logits (N, V) of the next token: the cache sees only the newest token, else the whole prefix."""
    inputs = tokens[:, -1:] if caches is not None else tokens
    return model.decode(inputs, memory, memory_padding_mask, caches=caches)[:, -1]


def _strip(model: TranslationTransformer, tokens: list[int]) -> list[int]:
    eos = model.config.eos_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@torch.no_grad()
def greedy_decode(
    model: TranslationTransformer,
    src: torch.Tensor,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """The most probable token at each step; returns target ids per sentence, without BOS/EOS."""
    cfg = model.config
    src_padding_mask = model.padding_mask(src)
    memory = model.encode(src, src_padding_mask)
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    caches = model.new_caches() if use_cache else None
    tokens = src.new_full((src.shape[0], 1), cfg.bos_id)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for step in range(int(limits.max())):
        logits = _step_logits(model, tokens, memory, src_padding_mask, caches)
        next_tokens = _next_token_logprobs(model, logits, step, limits).argmax(dim=-1)
        next_tokens = next_tokens.masked_fill(finished, cfg.pad_id)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        finished |= next_tokens == cfg.eos_id
        if finished.all():
            break
    return [_strip(model, row[1:]) for row in tokens.tolist()]


def _reorder_caches(caches: list[dict[str, Any]] | None, indices: torch.Tensor) -> None:
    for layer in caches or ():
        for cache in layer.values():
            cache.reorder(indices)


@torch.no_grad()
def beam_search(
    model: TranslationTransformer,
    src: torch.Tensor,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """Beam search as in fairseq: K live hypotheses per sentence; a hypothesis ending in EOS among the
    K best candidates is finished with score log p / length**length_penalty; a sentence is done once K
    are finished. Returns the best target ids per sentence, without BOS/EOS (beam_size 1 = greedy)."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    cfg, k = model.config, beam_size
    batch = src.shape[0]
    src_padding_mask = model.padding_mask(src)
    memory = model.encode(src, src_padding_mask)
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    # Every sentence's memory repeated for its K hypotheses: rows b*K .. b*K+K-1.
    memory = memory.repeat_interleave(k, dim=0)
    src_padding_mask = src_padding_mask.repeat_interleave(k, dim=0)
    row_limits = limits.repeat_interleave(k)
    caches = model.new_caches() if use_cache else None
    tokens = src.new_full((batch * k, 1), cfg.bos_id)
    scores = torch.full((batch, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all K start as the same empty hypothesis: keep one, or the beam fills with copies
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    offsets = torch.arange(batch, device=src.device)[:, None] * k
    for step in range(int(limits.max())):
        logits = _step_logits(model, tokens, memory, src_padding_mask, caches)
        logprobs = _next_token_logprobs(model, logits, step, row_limits)  # (B*K, V)
        vocab = logprobs.shape[-1]
        candidates = (scores[:, :, None] + logprobs.view(batch, k, vocab)).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)  # (B, 2K): at most K of them end in EOS
        top_beams, top_tokens = top_index // vocab, top_index % vocab
        is_eos = top_tokens == cfg.eos_id
        history = tokens.view(batch, k, -1)
        for b, j in (is_eos[:, :k] & torch.isfinite(top_scores[:, :k])).nonzero().tolist():
            if done[b] or len(finished[b]) >= k:
                continue
            hypothesis = history[b, top_beams[b, j], 1:].tolist()
            finished[b].append((top_scores[b, j].item() / (step + 1) ** length_penalty, hypothesis))
        done |= torch.tensor([len(f) >= k for f in finished])
        if done.all():
            break
        # The K best candidates that do not end here live on (stable sort keeps score order).
        keep = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :k]
        scores = top_scores.gather(1, keep)
        rows = (offsets + top_beams.gather(1, keep)).view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), top_tokens.gather(1, keep).view(-1, 1)], dim=1)
        _reorder_caches(caches, rows)
    return [max(hypotheses, key=lambda h: h[0])[1] for hypotheses in finished]
