"""The contract between MultiHeadAttention and its kernels, and the decoding states they keep.

A kernel computes attention on heads that are already projected (and rotated, with RoPE):

    kernel(q, k, v, *, causal, key_padding_mask, dropout_p, need_weights) -> (out, weights | None)
    kernel.new_cache() -> a DecodingState
    kernel.decode(q, k, v, cache, *, key_padding_mask, need_weights) -> (out, weights | None)

q is (B, H, T, D), k and v (B, H, S, D), key_padding_mask (B, S) bool (True = padding). `weights`, when
asked for, are the effective attention probabilities (B, H, T, S): zeros where the kernel does not attend.
Query rows that may attend to no key output zeros. `decode` is always causal: the new queries (B, H, t, D)
sit after everything the cache has seen; its key_padding_mask covers the new tokens ((B, t), or (B, offset
+ t) of which the last t columns are used) and the cache remembers the padding of earlier keys.

Each kernel is a small `Kernel` (an nn.Module, so that a kernel may own buffers or parameters) built in two
steps: `Kernel(**options)` takes only the kernel's own options as keyword-only arguments and checks them
(one-line ValueError); `setup(layout, num_heads=...)` then tells it about the model's token sequences and
its number of heads. A kernel that is bidirectional only sets `supports_causal = False`. The options a kernel
accepts are read off its constructor, so adding a variant is one file, one line in zoo/attention/registry.py
and one conf/attention/<name>.yaml.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class DecodingState(Protocol):
    """What a kernel keeps between decoding steps (a key/value cache, a rolling window, a recurrent state)."""

    offset: int  # tokens seen so far: the position of the next one

    def reorder(self, indices: torch.Tensor) -> None:
        """Keep the batch rows `indices` (beam search picks which hypotheses survive)."""


@runtime_checkable
class AttentionKernel(Protocol):
    name: ClassVar[str]
    supports_cross_attention: ClassVar[bool]
    supports_causal: ClassVar[bool]

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def new_cache(self) -> DecodingState: ...

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: Any,
        *,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class TokenLayout:
    """What a model tells its attention about the token sequences it attends over."""

    max_length: int | None = None  # the longest sequence (None: no limit, e.g. cross-attention memories)
    grid: tuple[int, int] | None = None  # image patches: the (rows, cols) grid, in row-major token order
    prefix_tokens: int = 0  # tokens before the grid (a class token); they sit at grid position (-1, -1)


class Kernel(nn.Module):
    """Base of the kernels in this package: the contract above, option discovery, and `setup`."""

    name: ClassVar[str] = ""
    supports_cross_attention: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True

    def setup(self, layout: TokenLayout, *, num_heads: int = 1) -> None:
        """Learn the model's token layout and head count (kernels that need a maximum length, a grid or
        per-head parameters override this)."""
        self.layout = layout
        self.num_heads = num_heads

    @classmethod
    def option_names(cls) -> list[str]:
        """The options this kernel accepts: its constructor's keyword-only arguments."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.option_names() if hasattr(self, name)}

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.options().items())

    def forward(self, q, k, v, *, causal=False, key_padding_mask=None, dropout_p=0.0, need_weights=False):
        raise NotImplementedError

    def new_cache(self) -> DecodingState:
        raise NotImplementedError

    def decode(self, q, k, v, cache, *, key_padding_mask=None, need_weights=False):
        raise NotImplementedError
