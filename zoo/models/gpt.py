"""GPT (Radford et al. 2018, 2019): a decoder-only Transformer language model.

Token + learned position embeddings (none with RoPE, ALiBi or T5 biases: positions then act inside
attention), pre-norm causal blocks from zoo.nn.blocks, a final LayerNorm and an LM head tied to the token
embedding. Any attention variant of zoo.attention works: generation keeps each block's decoding state (a KV
cache for full/RoPE attention, a rolling window for local, a recurrent state for linear), so a new token
costs one row, not the whole context.

block_size is the context the model is trained on. A model whose attention is made to extrapolate (a
position bias, or RoPE with a length scaling: AttentionConfig.extrapolates) takes longer sequences, and
generates past block_size with its caches instead of cropping the context (the point of ALiBi).

Weights copy one to one from and to Hugging Face `GPT2LMHeadModel`, and, with the Llama family's block options
(RMSNorm, SwiGLU, RoPE, grouped heads), `LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`
(`from_huggingface` of a model or a saved folder, `to_huggingface`; zoo/models/convert/huggingface.py maps them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, PackedDocuments, TokenLayout
from zoo.errors import CheckpointError, check_choice
from zoo.models.convert import huggingface
from zoo.nn import Dropout, ModelConfig, transformer_stack
from zoo.nn.blocks import MLPS, NORMS, BlockConfig, build_norm


@dataclass
class GPTConfig(ModelConfig):
    """GPT's architecture, and with norm=rmsnorm, mlp=swiglu, no biases and RoPE the Llama-shaped preset.

    The names are nanoGPT's and GPT-2's, kept for familiarity: n_layer, n_head and n_embd are what the other
    families call depth, num_heads and dim; block_size is their max_length.

    Args:
        vocab_size: token ids; the default is GPT-2's 50257 padded to a multiple of 64.
        block_size: the training context; also the longest one unless the attention extrapolates (RoPE, a bias).
        n_layer: Transformer blocks.
        n_head: attention heads per block.
        n_embd: width of the tokens.
        mlp_dim: hidden width of the MLP; None: 4 * n_embd (gated MLPs: ~8/3 n_embd, a multiple of 64).
        dropout: on embeddings, residual branches and MLP hidden units (attention probabilities: attention.dropout).
        bias: biases in Linear layers and LayerNorms (False: a little faster, as good).
        activation: the MLP's activation (zoo/nn/activations.py); GPT-2 itself: gelu_tanh.
        norm_eps: the norms' epsilon.
        tie_weights: the LM head shares the token embedding (Press & Wolf 2017).
        norm: layernorm | rmsnorm (Llama).
        mlp: gelu (two layers, with `activation`) | swiglu | geglu (gated).
        qkv_bias: biases of the q/k/v projection alone; None: as `bias` (Qwen2: true, with bias false).
        qk_norm: RMSNorm of queries and keys per head (OLMo 2, Qwen3).
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
        attention: the attention of every block (an AttentionConfig, or its dict).
    """

    family: ClassVar[str] = "gpt"
    sizes: ClassVar[tuple[str, ...]] = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_dim")

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_dim: int | None = None
    dropout: float = 0.0
    bias: bool = True
    activation: str = "gelu"
    norm_eps: float = 1e-5
    tie_weights: bool = True
    norm: str = "layernorm"
    mlp: str = "gelu"
    qkv_bias: bool | None = None
    qk_norm: bool = False
    checkpointing: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("gpt norm", self.norm, NORMS)
        check_choice("gpt mlp", self.mlp, MLPS)
        for name in ("bias", "qk_norm", "checkpointing", "tie_weights") + (
            ("qkv_bias",) if self.qkv_bias is not None else ()
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"gpt {name} must be true or false, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd must be divisible by n_head, got n_embd={self.n_embd} and n_head={self.n_head}")


class GPT(nn.Module):
    def __init__(self, config: GPTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or GPTConfig(**overrides)
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        # RoPE and position biases act inside attention, so no absolute table is added.
        relative = config.attention.relative_positions
        self.wpe = None if relative else LearnedPositionalEmbedding(config.n_embd, config.block_size)
        self.drop = Dropout(config.dropout)
        block = BlockConfig(
            dim=config.n_embd,
            num_heads=config.n_head,
            mlp_dim=config.mlp_dim,
            attention=config.attention,
            causal=True,
            dropout=config.dropout,
            activation=config.activation,
            bias=config.bias,
            norm_eps=config.norm_eps,
            layout=TokenLayout(max_length=config.block_size),
            norm=config.norm,
            mlp=config.mlp,
            qkv_bias=config.qkv_bias,
            qk_norm=config.qk_norm,
            checkpointing=config.checkpointing,
        )
        self.blocks = transformer_stack(block, config.n_layer)
        self.ln_f = build_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) everywhere, zero biases, and the projections that write into
        the residual stream scaled by 1/sqrt(2 n_layer) (two per block), so its variance stays O(1) with depth."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.self_attn.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.fc2.weight, mean=0.0, std=residual_std)

    def num_parameters(self, exclude_embeddings: bool = True) -> int:
        """Parameter count; by default without the position table (and without the token table if the
        head is untied), as GPT-2 and nanoGPT report it. A tied token table counts: it is the LM head."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            if self.wpe is not None:
                total -= self.wpe.weight.numel()
            if not self.config.tie_weights:
                total -= self.wte.weight.numel()
        return total

    @property
    def max_length(self) -> int | None:
        """The longest sequence the model takes: block_size, or None (any) when its attention extrapolates."""
        return None if self.config.attention.extrapolates else self.config.block_size

    def new_caches(self) -> list[dict[str, Any]]:
        """One fresh decoding state per block (whatever its attention variant keeps)."""
        return [block.new_cache() for block in self.blocks]

    def forward_features(
        self,
        idx: torch.Tensor,
        caches: list[dict[str, Any]] | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) -> final hidden states (B, T, n_embd).

        With `caches` (from `new_caches`), idx holds only the new tokens; they sit after everything cached.
        With `document_ids` (B, T) ints, each row packs several documents (a new one wherever the id changes):
        every token attends within its document and its position counts from the document's first token, so the
        states equal those of each document run alone (zoo/attention/documents.py).
        """
        documents = None
        if document_ids is not None:
            if caches is not None:
                raise ValueError("packed documents (document_ids) are for training and scoring, not cached decoding")
            documents = PackedDocuments.from_ids(document_ids)
        length = idx.shape[1]
        offset = caches[0]["self"].offset if caches is not None else 0
        if self.max_length is not None and offset + length > self.max_length:
            raise ValueError(
                f"sequence of {offset + length} tokens exceeds the model's block_size={self.config.block_size}"
            )
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = self.wpe(x, offset, None if documents is None else documents.positions)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=caches[i] if caches is not None else None, documents=documents)
        return self.ln_f(x)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per block, the causal attention probabilities (B, n_head, T, T) of token ids idx (B, T), as the
        kernel effectively applies them (zeros where it does not attend). For inspection: slower."""
        if idx.shape[1] > self.config.block_size:
            raise ValueError(
                f"sequence of {idx.shape[1]} tokens exceeds the model's block_size={self.config.block_size}"
            )
        x = self.wte(idx)
        if self.wpe is not None:
            x = self.wpe(x)
        weights = []
        for block in self.blocks:
            x, attention = block(x, need_weights=True)
            weights.append(attention["self"])
        return weights

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features)  # (B, T, vocab_size)

    def forward(
        self,
        idx: torch.Tensor,
        caches: list[dict[str, Any]] | None = None,
        document_ids: torch.Tensor | None = None,
        scored: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) -> next-token logits (B, T, vocab_size); document_ids (B, T): packed documents.

        scored (B, T) bool: the logits of those positions only, (N, vocab_size) in row-major order. A task whose
        loss counts a few positions of each row (associative recall's queries) skips the head, the largest matrix
        product of a small model with a large vocabulary, everywhere else."""
        features = self.forward_features(idx, caches, document_ids)
        return self.forward_head(features if scored is None else features[scored])

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue the prompts idx (B, T) by max_new_tokens sampled tokens; returns (B, T + max_new_tokens).

        temperature 0 is greedy decoding. The model sees the last block_size tokens (nanoGPT's crop).
        Inside block_size each step feeds one token through the blocks' decoding states; beyond it every
        position shifts, which no cache survives, so each further step re-encodes the cropped context.
        Cached and uncached decoding therefore sample the same tokens for the same seed. A model whose
        attention extrapolates (max_length None) never crops: its caches carry on past block_size.
        """
        limit = self.max_length
        if idx.ndim != 2 or idx.shape[1] < 1 or (limit is not None and idx.shape[1] > limit):
            raise ValueError(
                f"prompt of {idx.shape[-1] if idx.ndim else 0} tokens does not fit: it must have 1 to "
                f"block_size={self.config.block_size} tokens, shape (batch, tokens)"
            )
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        check_sampling_options(temperature, top_k, top_p)
        was_training = self.training
        self.eval()
        try:
            caches = self.new_caches() if use_cache else None
            context = idx
            for step in range(max_new_tokens):
                cropped = limit is not None and idx.shape[1] > limit
                if step > 0 and caches is not None and not cropped:
                    context = idx[:, -1:]  # the caches hold everything before it
                elif cropped or caches is None:
                    context = idx[:, -limit:] if cropped else idx
                    caches = self.new_caches() if use_cache else None
                logits = self.forward_head(self.forward_features(context, caches)[:, -1])  # (B, vocab)
                next_token = sample_next_token(logits, temperature, top_k, top_p, generator)
                idx = torch.cat([idx, next_token], dim=1)
        finally:
            self.train(was_training)
        return idx

    # -- Hugging Face checkpoints (the maps: zoo/models/convert/huggingface.py) --------------------------------

    @classmethod
    def from_huggingface(cls, model: Any, attention: dict[str, Any] | None = None) -> GPT:
        """A zoo GPT with the weights of a `transformers` causal LM: GPT2LMHeadModel (any size), LlamaForCausalLM,
        Qwen2ForCausalLM or MistralForCausalLM, given as the model or as a folder written by save_pretrained
        (config.json and *.safetensors, read by zoo.weights). `attention` replaces fields of the attention the
        checkpoint describes (e.g. {"variant": "local", "window": 1024}, {"rope_scaling": "yarn", ...}).
        A config.json that zoo cannot honour, or that does not describe the weights (a tensor missing or of
        another shape), is one CheckpointError naming the file, the field or tensor, and what would work.
        """
        checkpoint = huggingface.read_checkpoint(model)
        try:
            fields = huggingface.gpt_config(checkpoint.config)
            config = GPTConfig(**fields)
        except ValueError as error:
            raise CheckpointError(f"{checkpoint.config_file}: {error}") from None
        if attention:  # another variant leaves the checkpoint's options behind (Mistral's window: local's)
            config = GPTConfig(**{**fields, "attention": config.attention.replace(**attention)})
        gpt = cls(config)
        state = huggingface.gpt_state_from_huggingface(checkpoint, gpt.state_dict(), config)
        gpt.load_state_dict(state, strict=False)  # a tied head is stored once, as wte.weight
        return gpt.to(checkpoint.dtype)

    def to_huggingface(self) -> Any:
        """The same network as a `transformers` model: GPT2LMHeadModel for a GPT-2 shaped one (LayerNorm, GELU
        MLP, full attention, learned positions); LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM for
        one with RMSNorm, a gated MLP and RoPE. ValueError naming what neither has."""
        return huggingface.gpt_to_huggingface(self.config, self.state_dict()).to(self.wte.weight.dtype)


@dataclass
class SamplingConfig:
    """How text is sampled from a GPT: one set of defaults for the samples logged during training and for
    mode=generate.

    Args:
        max_new_tokens: tokens generated after the prompt.
        temperature: the logits are divided by it; 0: greedy decoding.
        top_k: sample among the k most likely tokens only; None: no such filter.
        top_p: sample among the most likely tokens whose probabilities sum to p (nucleus); None: no such filter.
    """

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {self.max_new_tokens!r}")
        check_sampling_options(self.temperature, self.top_k, self.top_p)


def check_sampling_options(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0):
        raise ValueError(f"top_k must be a positive int or null, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or null, got {top_p!r}")


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Logits (B, vocab) -> next token ids (B, 1): temperature, then top-k, then nucleus (top-p,
    Holtzman et al. 2020) filtering; temperature 0 takes the argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the more likely ones already cover top_p; the most likely always stays.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
