"""Decoding state for incremental (token-by-token) attention.

Each variant keeps what it needs to attend from new queries to everything seen so far:
full attention a growing key/value cache, local attention a rolling window of keys, linear
attention a fixed-size recurrent state. All expose `offset` (tokens seen, for positions) and
`reorder(indices)` (beam search picks which batch rows survive).
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of all past tokens, (B, H, T, D), in a buffer that grows by doubling."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.offset = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values (B, H, t, D); return all keys/values so far (views, no copy)."""
        t = k.shape[2]
        end = self.offset + t
        if self.keys is None or end > self.keys.shape[2]:
            capacity = max(end, 2 * (self.keys.shape[2] if self.keys is not None else 16))
            keys = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            values = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
            if self.keys is not None:
                keys[:, :, : self.offset] = self.keys[:, :, : self.offset]
                values[:, :, : self.offset] = self.values[:, :, : self.offset]
            self.keys, self.values = keys, values
        self.keys[:, :, self.offset : end] = k
        self.values[:, :, self.offset : end] = v
        self.offset = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reorder(self, indices: torch.Tensor) -> None:
        if self.keys is not None:
            self.keys = self.keys.index_select(0, indices)
            self.values = self.values.index_select(0, indices)


class StaticKVCache:
    """Keys and values of a fixed context (cross-attention to an encoder), computed once."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.offset = 0

    def reorder(self, indices: torch.Tensor) -> None:
        if self.keys is not None:
            self.keys = self.keys.index_select(0, indices)
            self.values = self.values.index_select(0, indices)
