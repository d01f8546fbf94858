"""Local attention: sliding-window attention (zoo/attention/sliding_window.py) as a kernel, with a rolling cache of
`window` keys for decoding, and two pieces it composes:

- `global_tokens`: Longformer's global tokens (the first g attend to all, all to them), the band and the global
  rows and columns as disjoint blockwise parts (zoo/attention/global_tokens.py: BandWithGlobalTokens), decoded
  with a full cache;
- `sink_tokens`: StreamingLLM's attention sinks for a causal window (zoo/attention/sinks.py: WindowWithSinks),
  decoded with a cache that keeps the first tokens.
"""

from __future__ import annotations

import functools

import torch

from zoo.attention.blockwise import DENSE_MAX_LENGTH
from zoo.attention.cache import RollingKVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel
from zoo.attention.flex import flex_pattern_attention, resolve_backend
from zoo.attention.global_tokens import BandWithGlobalTokens, check_count
from zoo.attention.sinks import WindowWithSinks, check_sink_tokens
from zoo.attention.sliding_window import DEFAULT_BLOCK_SIZE, band, sliding_window_attention
from zoo.errors import check_positive_int


class LocalAttention(Kernel):
    """Sliding-window attention with a rolling cache of `window` keys for decoding.

    Backends (attention.backend): blockwise (the CPU's auto; up to DENSE_MAX_LENGTH keys, as the pattern kernels,
    the dense band mask), flex (CUDA's auto; zoo/attention/flex.py), sdpa (one SDPA call under the dense band mask).

    Args:
        window: keys per query (bidirectional: window // 2 on each side).
        chunk_size: query block length of the blockwise kernel; None: the measured defaults
            (fast.band.FORWARD_BLOCK_SIZE in the fast path's forward, DEFAULT_BLOCK_SIZE elsewhere).
        global_tokens: Longformer's global tokens: the first g attend to all and all to them (decoding then keeps
            every key); 0: none.
        sink_tokens: causal only: every query also sees the first s tokens, which the rolling cache keeps
            (StreamingLLM's attention sinks, zoo/attention/sinks.py); 0: none.
    """

    name = "local"
    supports_cross_attention = False
    supports_position_bias = True
    supports_packing = True
    backends = ("blockwise", "flex", "sdpa")
    example_options = ({"window": 5, "chunk_size": 4}, {"window": 64})

    def __init__(
        self, *, window: int = 256, chunk_size: int | None = None, global_tokens: int = 0, sink_tokens: int = 0
    ) -> None:
        super().__init__()
        check_positive_int("attention.window (variant 'local')", window)
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        check_count("attention.global_tokens (variant 'local')", global_tokens)
        check_sink_tokens(sink_tokens, global_tokens)
        self.window = window
        self.chunk_size = chunk_size  # None: the measured defaults
        self.global_tokens = global_tokens
        self.sink_tokens = sink_tokens
        self.piece: Kernel | None = None  # what global tokens or sinks make of the window, computed by that piece
        if global_tokens:
            self.piece = BandWithGlobalTokens(window, chunk_size or DEFAULT_BLOCK_SIZE, chunk_size, global_tokens)
        elif sink_tokens:
            self.piece = WindowWithSinks(window, sink_tokens)

    def use_backend(self, backend: str) -> None:
        super().use_backend(backend)
        if self.global_tokens:
            self.piece.use_backend(backend)

    def notice(self) -> str | None:
        """A window that reaches every token of the model's sequences both ways (window // 2 >= length - 1: the
        bidirectional band; a causal one needs only window >= length) is exactly full attention there."""
        length = getattr(self, "layout", None) and self.layout.max_length
        if not length or self.window // 2 < length - 1:
            return None
        return (
            f"attention.window={self.window} covers all {length} tokens of this model's sequences: local attention "
            f"is exactly full attention here; set attention.window below {length} for a sliding window"
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.piece is not None:
            return self.piece(q, k, v, call)
        backend = resolve_backend(self.name, self.backend, q, k, call.dropout_p, call.bias, call.need_weights)
        if backend == "flex":
            pattern = functools.partial(band, window=self.window, causal=call.causal)
            out = flex_pattern_attention(q, k, v, pattern, self._flex_masks, (call.causal,), call.key_padding_mask)
            return out, None
        # Up to DENSE_MAX_LENGTH keys one fused call under the band mask, as the pattern kernels: below it the
        # blocks' fixed costs exceed the work they save (`experiments/attention_benchmark.py --rows local
        # --lengths 64 256 1024`; figures in experiments/results/recipes.md).
        dense = backend == "sdpa" or k.shape[2] <= DENSE_MAX_LENGTH
        return sliding_window_attention(
            q, k, v, self.window, causal=call.causal, key_padding_mask=call.key_padding_mask,
            dropout_p=call.dropout_p, need_weights=call.need_weights, block_size=self.chunk_size, bias=call.bias,
            dense=dense,
        )  # fmt: skip

    def new_cache(self) -> RollingKVCache:
        return self.piece.new_cache() if self.piece is not None else RollingKVCache(self.window)

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: RollingKVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal: new queries (B, H, t, D) see the last window - 1 cached keys and themselves.

        Weights, if asked, cover the attended keys only: (B, H, t, kept + t); with global tokens, every key.
        """
        if self.piece is not None:
            return self.piece.decode(q, k, v, cache, call)
        keys, values, padding = cache.extend(k, v, new_tokens_padding(call.key_padding_mask, k.shape[2]))
        return sliding_window_attention(
            q, keys, values, self.window, causal=True, key_padding_mask=padding, need_weights=call.need_weights,
            block_size=self.chunk_size, bias=call.bias, start=cache.offset - keys.shape[2],
        )  # fmt: skip
