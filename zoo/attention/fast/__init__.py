"""The CPU fast paths of the attention kernels, behind one switch (as timm's `use_fused_attn()`).

Every kernel file reads as its definition in public torch ops (the reference path) plus one visible
dispatch, `if use_fast_kernels() and <the fast path applies>: return fast.<module>.<function>(...)`. The
code that exists only for speed lives in this package: calls of private `torch.ops.aten` ops (the CPU
flash kernel's log-sum-exp entry points, `unfold_backward`, `_safe_softmax`), custom autograd.Functions
that save time or memory, reused scratch tensors, and the NumPy dropout mask. Both paths compute the same
function; the kernels' exactness tests run under both settings (docs/fast-kernels.md).

    ZOO_FAST_KERNELS=0       turns the fast paths off for a process (default: on)
    set_fast_kernels(False)  the same at run time
"""

from __future__ import annotations

import os

_ENV = "ZOO_FAST_KERNELS"


def _from_env() -> bool:
    return os.environ.get(_ENV, "1").strip() != "0"


_enabled = _from_env()


def use_fast_kernels() -> bool:
    """Whether the kernels take their CPU fast paths (env ZOO_FAST_KERNELS, default on; `set_fast_kernels`)."""
    return _enabled


def set_fast_kernels(enabled: bool = True) -> None:
    """Turn the fast paths on or off for this process (overrides ZOO_FAST_KERNELS)."""
    global _enabled
    _enabled = bool(enabled)


__all__ = ["set_fast_kernels", "use_fast_kernels"]
