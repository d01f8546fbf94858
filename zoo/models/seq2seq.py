"""The one interface every translation model gives the translation task and the search, and the search itself:
greedy decoding and beam search, shared by the Transformer (translation.py) and the RNN (rnn_translation.py).

A translation model (`Seq2SeqModel`) is a pure nn.Module with

    config                       pad_id, bos_id, eos_id, max_length (the longest target it may produce)
    padding_mask(src)            (B, S) bool, True = padding
    forward(src, tgt)            teacher forcing: source (B, S), decoder input (B, T) -> next-token logits (B, T, V)
    start_decoding(src, repeats, use_cache)
                                 encodes the source once and returns the decoding state of B * repeats rows
                                 (row b * repeats + r is hypothesis r of sentence b)
    decode_step(tokens, state)   the prefix so far (N, t) -> logits (N, V) of token t + 1; the state advances
                                 over the tokens it has not seen (a KV cache, a recurrent state), or, built with
                                 use_cache=False, recomputes the prefix each step
    state.reorder(indices)       keep the rows `indices` (beam search picks which hypotheses survive)
    cross_attention_weights(src, tgt)
                                 per attention layer, the decoder's attention over the source (B, H, T, S); an
                                 empty list for a model without attention (the fixed-vector RNN)

so that the loss, BLEU, greedy and beam search, mode=translate, mode=attention_maps and zoo.load need nothing else.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class SearchState(Protocol):
    """What a model keeps between decoding steps (encoder output, caches or recurrent state)."""

    def reorder(self, indices: torch.Tensor) -> None: ...


@runtime_checkable
class Seq2SeqModel(Protocol):
    config: Any  # pad_id, bos_id, eos_id, max_length

    def padding_mask(self, src: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor: ...

    def start_decoding(self, src: torch.Tensor, repeats: int = 1, use_cache: bool = True) -> SearchState: ...

    def decode_step(self, tokens: torch.Tensor, state: SearchState) -> torch.Tensor: ...

    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]: ...


def _max_lengths(model: Seq2SeqModel, src: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """Most target tokens (EOS included) per sentence: a * source length + b, within the model's max length."""
    source_lengths = (~model.padding_mask(src)).sum(dim=1)
    limits = (max_len_a * source_lengths.float() + max_len_b).long()
    return limits.clamp(min=1, max=model.config.max_length - 1)


def _next_token_logprobs(model: Seq2SeqModel, logits: torch.Tensor, step: int, limits: torch.Tensor) -> torch.Tensor:
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


def _strip(model: Seq2SeqModel, tokens: list[int]) -> list[int]:
    eos = model.config.eos_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel,
    src: torch.Tensor,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """The most probable token at each step; returns target ids per sentence, without BOS/EOS."""
    cfg = model.config
    state = model.start_decoding(src, 1, use_cache)
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    tokens = src.new_full((src.shape[0], 1), cfg.bos_id)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for step in range(int(limits.max())):
        logits = model.decode_step(tokens, state)
        next_tokens = _next_token_logprobs(model, logits, step, limits).argmax(dim=-1)
        next_tokens = next_tokens.masked_fill(finished, cfg.pad_id)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        finished |= next_tokens == cfg.eos_id
        if finished.all():
            break
    return [_strip(model, row[1:]) for row in tokens.tolist()]


@torch.no_grad()
def beam_search(
    model: Seq2SeqModel,
    src: torch.Tensor,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
    return_scores: bool = False,
) -> list[list[int]] | list[tuple[list[int], float]]:
    """Beam search as in fairseq: K live hypotheses per sentence; a hypothesis ending in EOS among the
    K best candidates is finished with score log p / length**length_penalty (length counts EOS); a sentence is
    done once K are finished. Returns the best target ids per sentence, without BOS/EOS (beam_size 1 = greedy),
    or with return_scores (ids, log p of ids + EOS) pairs."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    cfg, k = model.config, beam_size
    batch = src.shape[0]
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    # Every sentence's state repeated for its K hypotheses: rows b*K .. b*K+K-1.
    state = model.start_decoding(src, k, use_cache)
    row_limits = limits.repeat_interleave(k)
    tokens = src.new_full((batch * k, 1), cfg.bos_id)
    scores = torch.full((batch, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all K start as the same empty hypothesis: keep one, or the beam fills with copies
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    offsets = torch.arange(batch, device=src.device)[:, None] * k
    for step in range(int(limits.max())):
        logits = model.decode_step(tokens, state)
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
            logp = top_scores[b, j].item()
            finished[b].append((logp / (step + 1) ** length_penalty, logp, hypothesis))
        done |= torch.tensor([len(f) >= k for f in finished])
        if done.all():
            break
        # The K best candidates that do not end here live on (stable sort keeps score order).
        keep = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :k]
        scores = top_scores.gather(1, keep)
        rows = (offsets + top_beams.gather(1, keep)).view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), top_tokens.gather(1, keep).view(-1, 1)], dim=1)
        state.reorder(rows)
    best = [max(hypotheses, key=lambda h: h[0]) for hypotheses in finished]
    return [(ids, logp) for _, logp, ids in best] if return_scores else [ids for _, _, ids in best]
