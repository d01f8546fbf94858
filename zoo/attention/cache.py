"""Decoding state for incremental (token-by-token) attention.

Each variant keeps what it needs to attend from new queries to everything seen so far:
full attention a growing key/value cache, local attention a rolling window of keys, linear
attention a fixed-size recurrent state. All expose `offset` (tokens seen, for positions) and
`reorder(indices)` (beam search picks which batch rows survive).

Padding: the kernels' `decode` takes a key_padding_mask for the new tokens ((B, t), or (B, offset + t)
of which the last t columns are used); the caches remember the padding of the keys they keep.
"""

from __future__ import annotations

import torch


def _concat_padding(
    past: torch.Tensor | None, past_len: int, new: torch.Tensor | None, batch: int, new_len: int, device: torch.device
) -> torch.Tensor | None:
    """Padding of past keys followed by the new ones; None while nothing was ever padded."""
    if past is None and new is None:
        return None
    if past is None:
        past = torch.zeros(batch, past_len, dtype=torch.bool, device=device)
    if new is None:
        new = torch.zeros(batch, new_len, dtype=torch.bool, device=device)
    return torch.cat([past, new], dim=1)


def new_tokens_padding(key_padding_mask: torch.Tensor | None, new_len: int) -> torch.Tensor | None:
    """The padding of the t newest keys from a (B, t) or (B, offset + t) mask."""
    if key_padding_mask is None:
        return None
    if key_padding_mask.shape[1] < new_len:
        raise ValueError(
            f"key_padding_mask must cover the {new_len} new tokens, got shape {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask[:, key_padding_mask.shape[1] - new_len :].bool()


class BatchState:
    """Base of the decoding states: every tensor it holds has the batch first, so `reorder` is one gather."""

    def reorder(self, indices: torch.Tensor) -> None:
        """Keep the batch rows `indices` (beam search picks which hypotheses survive)."""
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.index_select(0, indices))


class KVCache(BatchState):
    """Keys and values of all past tokens, (B, H, T, D), in a buffer that grows by doubling."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.padding: torch.Tensor | None = None  # (B, capacity) bool, True = padded key; None = no padding yet
        self.offset = 0

    def append(
        self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values (B, H, t, D) (and their padding (B, t)); return all keys/values so far (views)."""
        batch, t = k.shape[0], k.shape[2]
        end = self.offset + t
        if self.keys is None or end > self.keys.shape[2]:
            capacity = max(end, 2 * (self.keys.shape[2] if self.keys is not None else 16))
            keys = k.new_empty(batch, k.shape[1], capacity, k.shape[3])
            values = v.new_empty(batch, v.shape[1], capacity, v.shape[3])
            if self.keys is not None:
                keys[:, :, : self.offset] = self.keys[:, :, : self.offset]
                values[:, :, : self.offset] = self.values[:, :, : self.offset]
            if self.padding is not None:
                grown = torch.zeros(batch, capacity, dtype=torch.bool, device=k.device)
                grown[:, : self.offset] = self.padding[:, : self.offset]
                self.padding = grown
            self.keys, self.values = keys, values
        if padding is not None and self.padding is None:
            self.padding = torch.zeros(batch, self.keys.shape[2], dtype=torch.bool, device=k.device)
        if self.padding is not None:
            self.padding[:, self.offset : end] = padding if padding is not None else False
        self.keys[:, :, self.offset : end] = k
        self.values[:, :, self.offset : end] = v
        self.offset = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def key_padding_mask(self) -> torch.Tensor | None:
        """(B, offset) bool padding of all cached keys, or None if none was ever padded."""
        return None if self.padding is None else self.padding[:, : self.offset]


class RollingKVCache(BatchState):
    """The last `window - 1` keys and values (B, H, <= window - 1, D): all a causal sliding window needs.

    Memory stays O(window) however long the generation runs; `offset` counts every token seen.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.padding: torch.Tensor | None = None  # (B, kept) bool, True = padded key
        self.offset = 0

    def extend(
        self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Kept keys followed by the new ones (B, H, kept + t, D) and their padding; then roll the window."""
        kept = 0 if self.keys is None else self.keys.shape[2]
        keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        values = v if self.values is None else torch.cat([self.values, v], dim=2)
        key_padding = _concat_padding(self.padding, kept, padding, k.shape[0], k.shape[2], k.device)
        keep = min(self.window - 1, keys.shape[2])
        start = keys.shape[2] - keep
        # Copies, so that a long prompt's keys are not held alive by a view.
        self.keys = keys[:, :, start:].clone()
        self.values = values[:, :, start:].clone()
        self.padding = None if key_padding is None else key_padding[:, start:].clone()
        self.offset += k.shape[2]
        return keys, values, key_padding


class LinearAttentionState(BatchState):
    """Recurrent state of causal linear attention (Katharopoulos et al. 2020, eq. 18-20).

    `state` (B, H, D, D + 1) holds [S | z]: S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j), so memory
    is O(1) in the number of tokens seen.
    """

    def __init__(self) -> None:
        self.state: torch.Tensor | None = None
        self.offset = 0


class StaticKVCache(BatchState):
    """Keys and values of a fixed context (cross-attention to an encoder), computed once."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.offset = 0
