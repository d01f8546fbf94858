"""The RNN encoder-decoder for translation: where attention came from, before the Transformer dropped recurrence.

    encoder   a bidirectional GRU or LSTM over the source embeddings (`cell`, `layers`, `hidden`)
    decoder   a GRU or LSTM over the target embeddings, started from the encoder's final states (a bridge:
              tanh(W [forward final; backward final]) per layer, as Bahdanau et al. 2015 start from the backward one)
    context   attention=None: one fixed vector c, the top layer's start state, fed to every decoder step and to
              the output (Cho et al. 2014; Sutskever et al. 2014 use only the start state): the whole source
              squeezed into one vector. attention=full | additive: c_t = attention of the decoder state h_t over
              the encoder states, by the shared core's MultiHeadAttention (one head, cross-attention): dot
              product ("global, dot", Luong et al. 2015, on projected states) or Bahdanau's additive score.
    output    h~_t = tanh(W_c [h_t; c_t]), logits = W_s h~_t (Luong et al. 2015, eq. 5-6)

The attention follows Luong et al.'s order (the decoder state h_t queries the encoder, then the output reads
[h_t; c_t]), without input feeding: the recurrence then runs over the whole target in one call in training, and
every target position's attention is one batched call. Bahdanau's score function is the same either way.

The model implements zoo/models/seq2seq.py's interface, so the translation task (loss, BLEU, greedy and beam
search, mode=translate, attention_maps, export, zoo.load) drives it unchanged; the beam search reorders the
recurrent state with the hypotheses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from zoo.attention import AttentionConfig, MultiHeadAttention, Placement
from zoo.hardware import native_bf16
from zoo.nn import ModelConfig

CELLS = ("gru", "lstm")
ATTENTIONS = ("full", "additive")  # and None: the fixed-vector baseline


@dataclass
class RNNTranslationConfig(ModelConfig):
    """The RNN encoder-decoder's architecture: recurrent cells, sizes and the decoder's attention.

    Args:
        vocab_size: shared source/target vocabulary (joint BPE), one embedding table for both sides.
        embed_dim: token embedding width.
        hidden: units per direction of the encoder, and of the decoder and its attention.
        layers: stacked recurrent layers of the encoder and of the decoder.
        cell: gru | lstm.
        attention: the decoder's attention over the encoder states: an AttentionConfig (or dict) of variant full
            (dot product) or additive (Bahdanau), or None for the fixed-vector baseline.
        dropout: on embeddings, between recurrent layers and before the output projection.
        max_length: the longest target the search produces (the task's data cut sentences to it).
        pad_id: the padding token's id.
        bos_id: the beginning-of-sentence token's id.
        eos_id: the end-of-sentence token's id.
    """

    family: ClassVar[str] = "rnn_translation"
    sizes: ClassVar[tuple[str, ...]] = ("vocab_size", "embed_dim", "hidden", "layers", "max_length")

    vocab_size: int = 1000
    embed_dim: int = 256
    hidden: int = 256
    layers: int = 1
    cell: str = "gru"
    attention: AttentionConfig | None = None
    dropout: float = 0.1
    max_length: int = 512
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.attention, str):
            self.attention = AttentionConfig(variant=self.attention)
        super().__post_init__()
        if self.cell not in CELLS:
            raise ValueError(f"unknown rnn_translation cell {self.cell!r}; valid choices: {', '.join(CELLS)}")
        if self.attention is not None and self.attention.variant not in ATTENTIONS:
            raise ValueError(
                f"the RNN decoder's attention={self.attention.variant!r} is not one of its choices: none "
                f"(model.net.attention=null, the fixed vector), {', '.join(ATTENTIONS)}"
            )
        if self.attention is not None:
            try:
                self.attention.validate(Placement(cross=True))  # over the encoder states
            except ValueError as error:
                raise ValueError(
                    f"{error}; the RNN decoder's attention is cross-attention over the encoder states: it takes "
                    "attention=full | additive (with their options, dropout, backend) or model.net.attention=null"
                ) from None
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"rnn_translation dropout must be in [0, 1), got {self.dropout!r}")


class RNNSearchState:
    """The RNN's decoding state: encoder states and padding, the fixed context (attention=None), the decoder's
    recurrent state (h, or (h, c) for an LSTM: (layers, N, hidden)) and the tokens it has read."""

    def __init__(self, encoded: dict[str, Any], hidden: Any, use_cache: bool) -> None:
        self.encoded, self.hidden, self.start, self.use_cache = encoded, hidden, hidden, use_cache
        self.offset = 0

    def reorder(self, indices: torch.Tensor) -> None:
        self.encoded = {k: None if v is None else v.index_select(0, indices) for k, v in self.encoded.items()}
        self.hidden = _select_state(self.hidden, indices)
        self.start = _select_state(self.start, indices)


def _recur(rnn: nn.RNNBase, x: Any, state: Any = None) -> tuple[Any, Any]:
    """rnn(x, state). Under CPU autocast to bf16 on a CPU without native bf16 the cell runs in float32: oneDNN has
    no bf16 recurrent kernel there ("could not create a primitive descriptor for the LSTM"), and emulated bf16
    would be slower than float32 anyway."""
    device = (x.data if isinstance(x, PackedSequence) else x).device
    lowered = (
        device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )
    if not lowered or native_bf16("cpu"):
        return rnn(x, state)
    if state is not None:
        state = tuple(s.float() for s in state) if isinstance(state, tuple) else state.float()
    with torch.autocast("cpu", enabled=False):
        return rnn(x.float(), state)


def _select_state(state: Any, indices: torch.Tensor) -> Any:
    if isinstance(state, tuple):
        return tuple(s.index_select(1, indices) for s in state)
    return state.index_select(1, indices)


class RNNTranslation(nn.Module):
    def __init__(self, config: RNNTranslationConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        config = config or RNNTranslationConfig(**overrides)
        self.config = c = config
        rnn = nn.GRU if c.cell == "gru" else nn.LSTM
        between = c.dropout if c.layers > 1 else 0.0
        self.embed = nn.Embedding(c.vocab_size, c.embed_dim, padding_idx=c.pad_id)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = rnn(c.embed_dim, c.hidden, c.layers, batch_first=True, bidirectional=True, dropout=between)
        # [forward final; backward final] -> the decoder's start state, per layer (and the LSTM's cell state)
        self.bridge = nn.Linear(2 * c.hidden, c.hidden)
        self.cell_bridge = nn.Linear(2 * c.hidden, c.hidden) if c.cell == "lstm" else None
        fixed = c.attention is None
        self.decoder = rnn(c.embed_dim + (c.hidden if fixed else 0), c.hidden, c.layers, batch_first=True,
                           dropout=between)  # fmt: skip
        if fixed:
            self.memory_proj, self.attention = None, None
        else:  # encoder states (2 * hidden) into the attention's width: its keys and values
            self.memory_proj = nn.Linear(2 * c.hidden, c.hidden)
            self.attention = MultiHeadAttention(c.hidden, 1, c.attention, cross_attention=True)
        self.combine = nn.Linear(2 * c.hidden, c.hidden)
        self.output = nn.Linear(c.hidden, c.vocab_size)

    def padding_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens == self.config.pad_id

    # -- encoder ----------------------------------------------------------------------------------
    def encode(self, src: torch.Tensor) -> tuple[dict[str, Any], Any]:
        """Source ids (B, S) -> ({memory (B, S, hidden) or None, padding (B, S), context (B, hidden) or None},
        the decoder's start state)."""
        c = self.config
        padding = self.padding_mask(src)
        lengths = (~padding).sum(dim=1).clamp(min=1).cpu()
        x = self.dropout(self.embed(src))
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        states, final = _recur(self.encoder, packed)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])  # (B, S, 2 hidden)

        def start(last: torch.Tensor, bridge: nn.Linear) -> torch.Tensor:  # (2 layers, B, H) -> (layers, B, H)
            last = last.view(c.layers, 2, *last.shape[1:])
            return torch.tanh(bridge(torch.cat([last[:, 0], last[:, 1]], dim=-1)))

        if c.cell == "lstm":
            hidden = (start(final[0], self.bridge), start(final[1], self.cell_bridge))
        else:
            hidden = start(final, self.bridge)
        top = hidden[0][-1] if isinstance(hidden, tuple) else hidden[-1]
        encoded = {
            "memory": None if self.memory_proj is None else self.memory_proj(states),
            "padding": padding,
            "context": top if self.attention is None else None,  # the fixed vector c
        }
        return encoded, hidden

    # -- decoder ----------------------------------------------------------------------------------
    def decode(
        self, tgt: torch.Tensor, encoded: dict[str, Any], hidden: Any, need_weights: bool = False
    ) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
        """Target ids (B, T) from recurrent state `hidden` -> logits (B, T, V), the state after them, and the
        attention (B, 1, T, S) if need_weights (None without attention)."""
        x = self.dropout(self.embed(tgt))
        context = encoded["context"]
        if context is not None:
            x = torch.cat([x, context[:, None].expand(-1, x.shape[1], -1)], dim=-1)
        states, hidden = _recur(self.decoder, x, hidden)  # (B, T, H)
        weights = None
        if self.attention is not None:
            attended = self.attention(
                states, encoded["memory"], key_padding_mask=encoded["padding"], need_weights=need_weights
            )
            context, weights = attended if need_weights else (attended, None)
        else:
            context = context[:, None].expand_as(states)
        combined = torch.tanh(self.combine(torch.cat([states, context], dim=-1)))
        return self.output(self.dropout(combined)), hidden, weights

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: source (B, S) and decoder input (B, T) ids -> next-token logits (B, T, V)."""
        encoded, hidden = self.encode(src)
        return self.decode(tgt, encoded, hidden)[0]

    @torch.no_grad()
    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """The decoder's attention (B, 1, T, S) over the source as a one-layer list; [] for the fixed vector."""
        if self.attention is None:
            return []
        encoded, hidden = self.encode(src)
        return [self.decode(tgt, encoded, hidden, need_weights=True)[2]]

    # -- the search interface (zoo/models/seq2seq.py) ---------------------------------------------
    def start_decoding(self, src: torch.Tensor, repeats: int = 1, use_cache: bool = True) -> RNNSearchState:
        encoded, hidden = self.encode(src)
        state = RNNSearchState(encoded, hidden, use_cache)
        if repeats > 1:
            state.reorder(torch.arange(src.shape[0], device=src.device).repeat_interleave(repeats))
        return state

    def decode_step(self, tokens: torch.Tensor, state: RNNSearchState) -> torch.Tensor:
        """Logits (N, V) after the prefix (N, t): the recurrent state reads only the tokens it has not read (with
        use_cache=False it reads the whole prefix from the start state each step)."""
        if not state.use_cache:
            return self.decode(tokens, state.encoded, state.start)[0][:, -1]
        logits, state.hidden, _ = self.decode(tokens[:, state.offset :], state.encoded, state.hidden)
        state.offset = tokens.shape[1]
        return logits[:, -1]
