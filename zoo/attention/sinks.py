"""Attention sinks (StreamingLLM, Xiao et al. 2023) for causal sliding-window attention: every query also sees
the first `sinks` tokens of the sequence, whose keys the rolling decoding cache keeps for good.

Softmax attention puts much of its mass on the first tokens whatever they say; a plain window evicts them once
the sequence is longer than the window, and the scores lose their sink. Keeping them costs `sinks` keys per query.
Key positions stay the tokens' own (RoPE rotated before caching): the sinks sit at their true distance, not at
StreamingLLM's in-cache positions. Reference path: public torch ops, blocks of queries under a bool mask, so
time and memory grow as n (window + sinks), not n^2.
"""

from __future__ import annotations

import torch

from zoo.attention.cache import _concat_padding, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel
from zoo.attention.functional import masked_attention

# Queries per block in the forward: keys per block are sinks + window + block.
SINK_BLOCK_SIZE = 256


def check_sink_tokens(sink_tokens: object, global_tokens: int) -> None:
    """One-line errors for attention.sink_tokens (an int >= 0, not together with global tokens)."""
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
        raise ValueError(f"attention.sink_tokens must be an int >= 0 (0: no attention sinks), got {sink_tokens!r}")
    if global_tokens and sink_tokens:
        raise ValueError(
            f"attention.global_tokens={global_tokens} and attention.sink_tokens={sink_tokens}: give one of them "
            "(global tokens already attend to all and are seen by all, sinks are seen by all)"
        )


def check_sinks_apply(sink_tokens: int, causal: bool, bias: object) -> None:
    """Sinks keep the first tokens of a causal window, without a position bias: a one-line error otherwise."""
    if not causal or bias is not None:
        raise ValueError(
            f"attention.sink_tokens={sink_tokens} keeps the first tokens of a causal window without a "
            f"position bias; this attention is causal={causal}, position_bias={'set' if bias is not None else None}"
        )


def sink_window_mask(
    query_positions: torch.Tensor, key_positions: torch.Tensor, window: int, sinks: int
) -> torch.Tensor:
    """(T, S) bool, True = may attend: causal, within the window or one of the first `sinks` tokens."""
    distance = query_positions[:, None] - key_positions[None, :]
    return (distance >= 0) & ((distance < window) | (key_positions[None, :] < sinks))


def sliding_window_attention_with_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    sinks: int,
    key_positions: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    block_size: int = SINK_BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal q (B, H, T, D) over k, v (B, G, S, D) whose positions are `key_positions` (S,) (default 0..S-1);
    the queries are the last T keys' tokens. need_weights: (B, H, T, S) probabilities (one dense call)."""
    q_len, k_len = q.shape[2], k.shape[2]
    positions = key_positions if key_positions is not None else torch.arange(k_len, device=q.device)
    query_positions = positions[k_len - q_len :]
    padding = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
    if need_weights or q_len <= block_size or key_positions is not None:
        allowed = sink_window_mask(query_positions, positions, window, sinks)
        if padding is not None:
            allowed = allowed & ~padding
        return masked_attention(q, k, v, allowed, dropout_p, need_weights=need_weights)
    outs = []
    first = k_len - q_len
    for lo in range(0, q_len, block_size):  # query block lo..hi sees the sinks and the window before it
        hi = min(lo + block_size, q_len)
        start = max(first + lo - window + 1, 0)
        keys = torch.cat(
            [torch.arange(min(sinks, start), device=q.device), torch.arange(start, first + hi, device=q.device)]
        )
        allowed = sink_window_mask(query_positions[lo:hi], positions[keys], window, sinks)
        if padding is not None:
            allowed = allowed & ~padding[..., keys]
        out, _ = masked_attention(q[:, :, lo:hi], k[:, :, keys], v[:, :, keys], allowed, dropout_p)
        outs.append(out)
    return torch.cat(outs, dim=2), None


class SinkKVCache:
    """The first `sinks` keys and values for good, and the last `window - 1` after them (B, G, <= sinks + window
    - 1, D), with their positions: memory O(sinks + window) however long the generation runs."""

    def __init__(self, window: int, sinks: int) -> None:
        self.window = window
        self.sinks = sinks
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.padding: torch.Tensor | None = None  # (B, kept) bool, True = padded key
        self.offset = 0

    def extend(
        self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Kept keys followed by the new ones, their positions and padding; then keep the sinks and the window."""
        new_positions = torch.arange(self.offset, self.offset + k.shape[2], device=k.device)
        kept = 0 if self.keys is None else self.keys.shape[2]
        keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        values = v if self.values is None else torch.cat([self.values, v], dim=2)
        positions = new_positions if self.positions is None else torch.cat([self.positions, new_positions])
        key_padding = _concat_padding(self.padding, kept, padding, k.shape[0], k.shape[2], k.device)
        is_sink = positions < self.sinks
        recent = (~is_sink).nonzero().flatten()[-(self.window - 1) :] if self.window > 1 else positions[:0]
        keep = torch.cat([is_sink.nonzero().flatten(), recent])
        # Copies, so that a long prompt's keys are not held alive by a view.
        self.keys, self.values = keys[:, :, keep].clone(), values[:, :, keep].clone()
        self.positions = positions[keep].clone()
        self.padding = None if key_padding is None else key_padding[:, keep].clone()
        self.offset += k.shape[2]
        return keys, values, positions, key_padding

    def reorder(self, indices: torch.Tensor) -> None:
        if self.keys is not None:
            self.keys = self.keys.index_select(0, indices)
            self.values = self.values.index_select(0, indices)
        if self.padding is not None:
            self.padding = self.padding.index_select(0, indices)


class WindowWithSinks(Kernel):
    """LocalAttention's causal window with `sinks` attention sinks, as a piece the kernel composes
    (attention.sink_tokens): the forward above, and decoding with a SinkKVCache."""

    name = "local"  # in its errors, the user's variant

    def __init__(self, window: int, sinks: int) -> None:
        super().__init__()
        self.window, self.sinks = window, sinks

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall):
        check_sinks_apply(self.sinks, call.causal, call.bias)
        return sliding_window_attention_with_sinks(
            q, k, v, self.window, self.sinks, key_padding_mask=call.key_padding_mask, dropout_p=call.dropout_p,
            need_weights=call.need_weights,
        )  # fmt: skip

    def new_cache(self) -> SinkKVCache:
        return SinkKVCache(self.window, self.sinks)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: SinkKVCache, call: AttentionCall):
        check_sinks_apply(self.sinks, True, call.bias)
        keys, values, positions, padding = cache.extend(k, v, new_tokens_padding(call.key_padding_mask, k.shape[2]))
        return sliding_window_attention_with_sinks(
            q, keys, values, self.window, self.sinks, positions, padding, need_weights=call.need_weights
        )
