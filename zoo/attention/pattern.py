"""Pattern kernels (sparse, axial): a boolean pattern over (query position, key position), computed as the
disjoint blockwise parts of zoo/attention/blockwise.py, with the rest of the kernel contract (dense path,
decoding, position bias, grouped key/value heads, backends)."""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from zoo.attention.blockwise import DENSE_MAX_LENGTH, Part, union_attention
from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel, TokenLayout
from zoo.attention.flex import flex_pattern_attention, resolve_backend
from zoo.attention.functional import masked_attention, repeat_kv, softmax_attention

PARTS_CACHE_SIZE = 8  # lengths whose parts (and masks) a kernel keeps


def _biased_dense_attention(q, k, v, allowed, bias, dropout_p, need_weights):
    """softmax(q k^T / sqrt(d) + bias) v under the bool mask `allowed`, by the formula; rows without keys
    output zeros."""
    empty = ~allowed.any(dim=-1, keepdim=True)
    out, probs = softmax_attention(q, k, v, bias.masked_fill(~(allowed | empty), float("-inf")), dropout_p)
    return out.masked_fill(empty, 0.0), probs.masked_fill(empty, 0.0) if need_weights else None


class PatternKernel(Kernel):
    """A kernel defined by a boolean pattern over (query position, key position), computed as parts.

    Subclasses give `allowed` (the pattern, for any broadcastable positions) and `parts` (the same pattern
    as disjoint blockwise parts). This class adds the rest of the contract: the dense path for
    need_weights and short sequences, decoding with a KVCache (a new chunk attends under the pattern's
    rows), a position bias (the contract's `bias`, ALiBi or T5) on both paths, and grouped key/value heads
    (kept grouped in the cache, expanded where the parts compute). Backends (attention.backend): blockwise
    (the parts; the CPU's auto), flex (the pattern as a FlexAttention block mask; CUDA's auto), sdpa (the
    dense path).
    """

    supports_cross_attention = False
    supports_position_bias = True
    supports_packing = True  # the pattern at positions inside each document
    backends = ("blockwise", "flex", "sdpa")

    def __init__(self) -> None:
        super().__init__()
        self._parts: dict = {}  # (length, causal, device, inference mode) -> parts; see cached_parts

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        self._parts.clear()  # parts (and block masks) follow the options that setup resolves
        self._flex_masks.clear()

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_parts": {}}  # a pickled kernel (spawned workers) rebuilds them

    def allowed(self, query_positions: torch.Tensor, key_positions: torch.Tensor, causal: bool) -> torch.Tensor:
        raise NotImplementedError

    def parts(self, length: int, causal: bool) -> list[Part]:
        """The pattern for `length` tokens as disjoint parts (CPU tensors)."""
        raise NotImplementedError

    def cached_parts(self, length: int, causal: bool, device: torch.device) -> list[Part]:
        """`parts` on `device`, kept for the last few lengths (training repeats them)."""
        key = (length, causal, device, torch.is_inference_mode_enabled())
        cache = self._parts
        if key not in cache:
            if len(cache) >= PARTS_CACHE_SIZE:
                cache.pop(next(iter(cache)))
            cache[key] = [
                replace(part, key_positions=part.key_positions.to(device), allowed=part.allowed.to(device))
                for part in self.parts(length, causal)
            ]
        return cache[key]

    def dense_mask(self, q_len: int, k_len: int, causal: bool, device: torch.device) -> torch.Tensor:
        """(q_len, k_len) bool: the pattern for queries at the last q_len of k_len positions."""
        rows = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        return self.allowed(rows, torch.arange(k_len, device=device)[None, :], causal)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        backend = resolve_backend(self.name, self.backend, q, k, call.dropout_p, call.bias, call.need_weights)
        if backend == "flex":
            pattern = functools.partial(self.allowed, causal=call.causal)
            out = flex_pattern_attention(q, k, v, pattern, self._flex_masks, (call.causal,), call.key_padding_mask)
            return out, None
        return self._attend(q, k, v, call, dense=backend == "sdpa")

    def _attend(self, q, k, v, call: AttentionCall, dense: bool = False):
        """Queries at the last q_len positions of the keys. need_weights, fewer queries than keys (decoding),
        sequences up to DENSE_MAX_LENGTH and `dense` (backend sdpa) take the dense (T, S) path."""
        causal, key_padding_mask, score_bias = call.causal, call.key_padding_mask, call.bias
        dropout_p, need_weights = call.dropout_p, call.need_weights
        q_len, k_len = q.shape[2], k.shape[2]
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        if need_weights or q_len != k_len or k_len <= DENSE_MAX_LENGTH or dense:
            allowed = self.dense_mask(q_len, k_len, causal, q.device)
            if key_padding_mask is not None:
                allowed = allowed & ~key_padding_mask.bool()[:, None, None, :]
            if score_bias is None:
                return masked_attention(q, k, v, allowed, dropout_p, need_weights)
            positions = torch.arange(k_len, device=q.device)
            bias = score_bias(positions[k_len - q_len :], positions)  # (H, T, S)
            return _biased_dense_attention(q, k, v, allowed, bias, dropout_p, need_weights)
        parts = self.cached_parts(q_len, causal, q.device)
        out = union_attention(
            q, k, v, parts, key_padding_mask=key_padding_mask, dropout_p=dropout_p, score_bias=score_bias
        )
        return out, None

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal: new queries (B, H, t, D) attend to the cached keys and themselves under the pattern.
        The first chunk (a prompt) runs blockwise; later chunks use the pattern's rows, (t, offset + t)."""
        keys, values = cache.append(k, v, new_tokens_padding(call.key_padding_mask, k.shape[2]))
        step = AttentionCall(True, cache.key_padding_mask(), need_weights=call.need_weights, bias=call.bias)
        return self._attend(q, keys, values, step)
