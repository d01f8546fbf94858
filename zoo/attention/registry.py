"""The registry of attention kernels: variant name -> Kernel class (the contract: zoo/attention/contract.py).

VARIANTS is the one list of variants: each kernel's class docstring says what it computes and its options (Args),
its class flags what it supports (causal, cross-attention, a position bias, packed documents, decoding); the API
reference (docs/reference/attention.md) renders the docstrings, and the helpers below read the flags.

A new variant is a Kernel subclass in its own file (with its `example_options`), one line in VARIANTS and one
conf/attention/<name>.yaml of its options (the shared settings come from conf/attention/base/settings.yaml):
docs/adding-a-kernel.md. The tests read their variant tables from VARIANTS, so it is tested from that line on.
"""

from __future__ import annotations

from typing import Any

from zoo.attention.additive import AdditiveAttention
from zoo.attention.axial import AxialAttention
from zoo.attention.compressed import CompressedAttention
from zoo.attention.contract import Kernel
from zoo.attention.full import FullAttention
from zoo.attention.linear import LinearAttention
from zoo.attention.local import LocalAttention
from zoo.attention.lsh import LSHAttention
from zoo.attention.routing import RoutingAttention
from zoo.attention.sparse import SparseAttention

VARIANTS: dict[str, type[Kernel]] = {
    "full": FullAttention,
    "local": LocalAttention,
    "linear": LinearAttention,
    "sparse": SparseAttention,
    "axial": AxialAttention,
    "compressed": CompressedAttention,
    "routing": RoutingAttention,
    "lsh": LSHAttention,
    "additive": AdditiveAttention,
}


def kernel_class(name: str) -> type[Kernel]:
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid choices: {sorted(VARIANTS)}")
    return VARIANTS[name]


def option_takers() -> dict[str, dict[str, Any]]:
    """Every option of any variant -> the variants that take it and its default in each, read off the kernels'
    constructors, e.g. {"window": {"local": 256}, "chunk_size": {"additive": None, ..., "lsh": 64}, ...}."""
    takers: dict[str, dict[str, Any]] = {}
    for name, kernel in sorted(VARIANTS.items()):
        for option, default in kernel.option_defaults().items():
            takers.setdefault(option, {})[name] = default
    return takers


def build_kernel(name: str, **options: Any) -> Kernel:
    """The kernel called `name` with its options (a one-line ValueError for a bad name or value)."""
    return kernel_class(name)(**options)


def cross_attention_variants() -> list[str]:
    return sorted(name for name, kernel in VARIANTS.items() if kernel.supports_cross_attention)


def causal_variants() -> list[str]:
    return sorted(name for name, kernel in VARIANTS.items() if kernel.supports_causal)


def packing_variants() -> list[str]:
    """The variants that attend within packed documents (zoo/attention/documents.py)."""
    return sorted(name for name, kernel in VARIANTS.items() if kernel.supports_packing)
