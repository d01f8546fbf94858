"""The registry of attention kernels. Each kernel is a small class with one shared signature:

    kernel(q, k, v, *, causal, key_padding_mask, dropout_p, need_weights) -> (out, weights | None)
    kernel.new_cache() -> decoding state
    kernel.decode(q, k, v, cache, *, key_padding_mask, need_weights) -> (out, weights | None)

with q (B, H, T, D), k and v (B, H, S, D), key_padding_mask (B, S) bool (True = padding).
"""

from __future__ import annotations

from typing import Any

from zoo.attention.full import FullAttention

VARIANTS: dict[str, Any] = {"full": FullAttention}


def get_variant(name: str, window: int | None = None, chunk_size: int | None = None) -> Any:
    """Instantiate the kernel called `name`; a one-line ValueError names the valid choices."""
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid choices: {sorted(VARIANTS)}")
    return VARIANTS[name](window=window, chunk_size=chunk_size)
