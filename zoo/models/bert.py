"""BERT (Devlin et al. 2019) and RoBERTa (Liu et al. 2019): an encoder-only masked language model.

Token + learned absolute position + token-type embeddings, summed, LayerNorm and dropout; post-norm blocks from
zoo.nn.blocks (LayerNorm after each residual add, as the original Transformer and BERT), bidirectional, GELU MLP;
no final LayerNorm (each block already ends with one). Two heads on the states: the MLM head (dense, GELU,
LayerNorm, then a decoder tied to the token embedding, with a bias of its own) predicts every position's token; the
pooler (dense + tanh on the first token, [CLS]) gives the sequence vector a classifier is fine-tuned on.

Any bidirectional attention variant of zoo.attention works (local, linear, compressed, lsh, axial, ...): the blocks
see the whole sequence, padding masked out. With RoPE or a position bias the absolute table is left out (positions
then act inside attention), as in GPT.

RoBERTa is the same network with fairseq's position ids (position_ids="roberta": they count the non-padding
tokens from padding_id + 1, padding sits at padding_id) and one token type. Weights copy one to one from and to
Hugging Face `BertForMaskedLM` and `RobertaForMaskedLM` (`from_huggingface` of a model or a saved folder,
`to_huggingface`; zoo/models/convert/huggingface_bert.py maps them). Their masked-LM checkpoints have no pooler:
it stays at its initialisation on import and is left out on export.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from zoo.attention import AttentionConfig, LearnedPositionalEmbedding, TokenLayout
from zoo.errors import CheckpointError, check_choice
from zoo.models.convert.huggingface_bert import (
    architecture_of,
    bert_config_from_huggingface,
    huggingface_config,
    state_from_huggingface,
    state_to_huggingface,
)
from zoo.nn import BlockConfig, Dropout, ModelConfig, transformer_stack
from zoo.nn.activations import get_activation
from zoo.weights import read_huggingface_folder

# bert: positions 0..T-1 whatever the padding; roberta: fairseq's, counted over the non-padding tokens from
# padding_id + 1 (padding itself at padding_id), so left padding leaves a sentence's positions as they were.
POSITION_IDS = ("bert", "roberta")


@dataclass
class BERTConfig(ModelConfig):
    """BERT's architecture (the defaults: BERT-base), and with position_ids=roberta, RoBERTa's.

    Args:
        vocab_size: token ids (BERT's WordPiece: 30522).
        max_length: rows of the position table: the longest sequence (RoBERTa's table also holds the
            padding_id + 1 positions before its first one).
        type_vocab_size: token types (segments A and B of a sentence pair; RoBERTa: 1).
        padding_id: the padding token: masked out of attention when no mask is given; None: never padded.
        position_ids: bert (0..T-1) | roberta (fairseq's: counted over the non-padding tokens from padding_id + 1).
        dim: width of the tokens.
        depth: Transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: hidden width of the MLP; None: 4 * dim.
        dropout: on the embeddings, residual branches and MLP hidden units (attention probabilities: attention.dropout).
        activation: the MLP's and the MLM head's activation (zoo/nn/activations.py).
        norm_eps: every LayerNorm's epsilon (BERT: 1e-12).
        checkpointing: activation checkpointing per block: recompute in the backward, less memory.
        attention: the attention of every block (an AttentionConfig, or its dict); bidirectional.
    """

    family: ClassVar[str] = "bert"
    sizes: ClassVar[tuple[str, ...]] = (
        "vocab_size", "max_length", "type_vocab_size", "dim", "depth", "num_heads", "mlp_dim",
    )  # fmt: skip

    vocab_size: int = 30522
    max_length: int = 512
    type_vocab_size: int = 2
    padding_id: int | None = 0
    position_ids: str = "bert"
    dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int | None = None
    dropout: float = 0.1
    activation: str = "gelu"
    norm_eps: float = 1e-12
    checkpointing: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("bert position_ids", self.position_ids, POSITION_IDS)
        if self.dim % self.num_heads != 0:
            raise ValueError(
                f"bert dim must be divisible by num_heads, got dim={self.dim} and num_heads={self.num_heads}"
            )
        if self.padding_id is not None and not 0 <= self.padding_id < self.vocab_size:
            raise ValueError(
                f"bert padding_id must be null or in [0, vocab_size={self.vocab_size}), got {self.padding_id}"
            )
        if self.position_ids == "roberta" and self.padding_id is None:
            raise ValueError("bert position_ids=roberta counts positions from padding_id + 1: set padding_id")
        if self.position_ids == "roberta" and self.padding_id + 1 >= self.max_length:
            raise ValueError(
                f"bert position_ids=roberta starts at padding_id + 1 = {self.padding_id + 1}, past the table of "
                f"max_length={self.max_length}; use max_length > {self.padding_id + 1}"
            )

    @property
    def first_position(self) -> int:
        """The position id of the first token: 0, or RoBERTa's padding_id + 1."""
        return self.padding_id + 1 if self.position_ids == "roberta" else 0


class MaskedLMHead(nn.Module):
    """BERT's MLM head: dense -> activation -> LayerNorm -> decoder. The decoder's weight is the token embedding
    (tied by the model); its bias is the head's own."""

    def __init__(self, dim: int, vocab_size: int, activation: str, norm_eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.act = get_activation(activation)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.decoder = nn.Linear(dim, vocab_size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(features))))  # (..., vocab_size)


class BERT(nn.Module):
    def __init__(self, config: BERTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or BERTConfig(**overrides)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.dim, padding_idx=config.padding_id)
        # RoPE and position biases act inside attention, so no absolute table is added.
        relative = config.attention.relative_positions
        self.position_embedding = None if relative else LearnedPositionalEmbedding(config.dim, config.max_length)
        self.token_type_embedding = nn.Embedding(config.type_vocab_size, config.dim)
        self.embedding_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.dropout = Dropout(config.dropout)
        block = BlockConfig(
            config.dim,
            config.num_heads,
            mlp_dim=config.mlp_dim,
            attention=config.attention,
            norm_first=False,  # post-norm: x = LayerNorm(x + sublayer(x)), as BERT
            dropout=config.dropout,
            activation=config.activation,
            norm_eps=config.norm_eps,
            layout=TokenLayout(max_length=config.max_length - config.first_position),
            checkpointing=config.checkpointing,
        )
        self.blocks = transformer_stack(block, config.depth)
        self.mlm_head = MaskedLMHead(config.dim, config.vocab_size, config.activation, config.norm_eps)
        self.mlm_head.decoder.weight = self.token_embedding.weight  # tied (Press & Wolf 2017), as BERT
        self.pooler = nn.Linear(config.dim, config.dim)
        self._init_weights()

    def _init_weights(self) -> None:
        """BERT's initialisation: N(0, 0.02) for every Linear and embedding, zero biases, the padding row zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
                nn.init.normal_(module.weight, std=0.02)
        if self.config.padding_id is not None:
            with torch.no_grad():
                self.token_embedding.weight[self.config.padding_id].zero_()

    @property
    def max_length(self) -> int | None:
        """The longest sequence the model takes, or None (any) when its attention extrapolates."""
        return None if self.config.attention.extrapolates else self.config.max_length - self.config.first_position

    def padding_mask(self, token_ids: torch.Tensor) -> torch.Tensor | None:
        """(B, T) ids -> (B, T) bool, True where the token is padding (None when the config has no padding)."""
        return None if self.config.padding_id is None else token_ids == self.config.padding_id

    def position_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T) rows of the position table: 0..T-1 (bert), or fairseq's (roberta)."""
        length = token_ids.shape[1]
        if self.config.position_ids == "bert":
            return torch.arange(length, device=token_ids.device).expand_as(token_ids)
        keep = (token_ids != self.config.padding_id).long()
        return torch.cumsum(keep, dim=1) * keep + self.config.padding_id

    def forward_features(
        self,
        token_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) -> the last block's states (B, T, dim).

        token_type_ids (B, T): the segment of each token (None: all 0). key_padding_mask (B, T) bool, True = padding
        (transformers' attention_mask == 0); None: the tokens equal to padding_id.
        """
        length = token_ids.shape[1]
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"sequence of {length} tokens exceeds the bert model's max_length={self.max_length}")
        if key_padding_mask is None:
            key_padding_mask = self.padding_mask(token_ids)
        if key_padding_mask is not None and not key_padding_mask.any():
            key_padding_mask = None  # nothing to mask: the kernels' unmasked path computes the same, faster
        x = self.token_embedding(token_ids)  # (B, T, dim)
        if self.position_embedding is not None:
            x = self.position_embedding(x, positions=self.position_ids(token_ids))
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(token_ids)
        x = self.dropout(self.embedding_norm(x + self.token_type_embedding(token_type_ids)))
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask)
        return x

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlm_head(features)  # (..., vocab_size)

    def pool(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, dim) states -> (B, dim): BERT's pooler, dense + tanh on the first token ([CLS])."""
        return torch.tanh(self.pooler(features[:, 0]))

    def forward(
        self,
        token_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        masked: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) -> MLM logits (B, T, vocab_size).

        masked (B, T) bool: the logits of those positions only, (N, vocab_size) in row-major order: the MLM loss
        counts ~15 % of the positions, and the decoder is the largest matrix product of a small model."""
        features = self.forward_features(token_ids, token_type_ids, key_padding_mask)
        return self.forward_head(features if masked is None else features[masked])

    # -- Hugging Face BERT / RoBERTa interop ----------------------------------------------------------

    @classmethod
    def from_huggingface(cls, model: Any, attention: dict[str, Any] | None = None) -> BERT:
        """A zoo BERT with the weights of a `transformers` BertForMaskedLM or RobertaForMaskedLM, given as the model
        or as a folder written by save_pretrained (config.json and *.safetensors, read by zoo.weights). `attention`
        replaces fields of the (full) attention, e.g. {"variant": "local", "window": 64}. A config.json zoo cannot
        honour, or that does not describe the weights, is one CheckpointError naming the file and the field or
        tensor."""
        if isinstance(model, (str, Path)):
            hf_config, state = read_huggingface_folder(model)
            where, config_file = repr(str(model)), str(Path(model).expanduser() / "config.json")
        else:
            hf_config, state = model.config.to_dict(), model.state_dict()
            where, config_file = "the Hugging Face model", "its config"
        try:
            architecture = architecture_of(hf_config)
            fields = bert_config_from_huggingface(hf_config)
            if attention:
                fields["attention"] = AttentionConfig(**fields["attention"]).replace(**attention).to_dict()
            config = BERTConfig(**fields)
        except ValueError as error:
            raise CheckpointError(f"{config_file}: {error}") from None
        bert = cls(config)
        expected = {
            name: tuple(t.shape) for name, t in state_to_huggingface(bert.state_dict(), config, architecture).items()
        }
        for name, tensor in state.items():
            if name in expected and tuple(tensor.shape) != expected[name]:
                raise CheckpointError(
                    f"{config_file} does not describe the weights: {name} is {tuple(tensor.shape)} in the weights, "
                    f"config.json implies {expected[name]}; use the config.json saved with these weights"
                )
        # The decoder's weight is the token table, its bias the head's `bias`: save_pretrained may write either once.
        missing = [name for name in expected if name not in state and ".decoder." not in name]
        if missing:
            raise CheckpointError(
                f"{where}: the weights lack {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
                f"({len(missing)} of the {len(expected)} tensors config.json describes); valid: the folder as "
                "save_pretrained wrote it"
            )
        ours = state_from_huggingface(state, config, architecture)
        missing, unexpected = bert.load_state_dict(ours, strict=False)
        missing = [name for name in missing if name not in ("mlm_head.decoder.weight", "pooler.weight", "pooler.bias")]
        if missing or unexpected:
            raise CheckpointError(
                f"{where}: the Hugging Face weights do not fit the model its config describes: missing "
                f"{missing[:4]}, unexpected {unexpected[:4]}"
            )
        dtype = next((t.dtype for t in ours.values() if t.is_floating_point()), torch.float32)
        return bert.to(dtype)

    def to_huggingface(self) -> Any:
        """The same network as a `transformers` model: RobertaForMaskedLM for position_ids=roberta, BertForMaskedLM
        otherwise (the pooler is left out: their masked-LM models have none). ValueError naming what they lack."""
        import transformers

        architecture, fields = huggingface_config(self.config)
        hf_config = getattr(transformers, architecture.replace("ForMaskedLM", "Config"))(**fields)
        model = getattr(transformers, architecture)(hf_config)
        state = state_to_huggingface(self.state_dict(), self.config, self.config.position_ids)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise RuntimeError(
                f"{architecture} export left weights unmatched: missing {missing}, unexpected {unexpected}"
            )
        return model.to(self.token_embedding.weight.dtype)
