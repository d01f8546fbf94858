"""The registry of attention kernels. Each kernel is a small class with one shared signature:

    kernel(q, k, v, *, causal, key_padding_mask, dropout_p, need_weights) -> (out, weights | None)
    kernel.new_cache() -> decoding state
    kernel.decode(q, k, v, cache, *, key_padding_mask, need_weights) -> (out, weights | None)

with q (B, H, T, D), k and v (B, H, S, D), key_padding_mask (B, S) bool (True = padding), and the
attribute `supports_cross_attention`. The constructor takes (window=None, chunk_size=None) and raises
a one-line ValueError for bad values.

`decode` is always causal: the new queries (B, H, t, D) sit after everything the cache has seen; its
key_padding_mask covers the new tokens ((B, t), or (B, offset + t) of which the last t columns are
used), the cache remembers the padding of earlier keys. Query rows that may attend to no key output zeros.

    full    softmax over all keys, fused SDPA; KVCache
    local   sliding window of `window` keys, blockwise O(n * window); RollingKVCache
    linear  elu + 1 feature map (Katharopoulos et al. 2020), O(n d^2); LinearAttentionState
"""

from __future__ import annotations

from typing import Any

from zoo.attention.full import FullAttention
from zoo.attention.linear import LinearAttention
from zoo.attention.local import LocalAttention

VARIANTS: dict[str, Any] = {"full": FullAttention, "local": LocalAttention, "linear": LinearAttention}


def get_variant(name: str, window: int | None = None, chunk_size: int | None = None) -> Any:
    """Instantiate the kernel called `name`; a one-line ValueError names the valid choices."""
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid choices: {sorted(VARIANTS)}")
    return VARIANTS[name](window=window, chunk_size=chunk_size)
