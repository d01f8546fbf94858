"""The contract between MultiHeadAttention and its kernels, and the decoding states they keep.

A kernel computes attention on heads that are already projected (and rotated, with RoPE). This docstring and
the `Kernel` base class below are the contract, stated once:

    kernel.forward(q, k, v, call) -> (out, weights | None)          call: an AttentionCall
    kernel.new_cache() -> a DecodingState
    kernel.decode(q, k, v, cache, call) -> (out, weights | None)

The per-call arguments are one frozen `AttentionCall` (causal, key_padding_mask, dropout_p, need_weights,
bias); calling a kernel with keywords, `kernel(q, k, v, causal=True)`, makes one. q is (B, H, T, D), k and v
(B, G, S, D), key_padding_mask (B, S) bool (True = padding). `weights`, when asked for, are the effective
attention probabilities (B, H, T, S): zeros where the kernel does not attend. Query rows that may attend to no
key output zeros. `decode` is always causal and never drops (its call's causal and dropout_p are not read): the
new queries (B, H, t, D) sit after everything the cache has seen; its key_padding_mask covers the new tokens
((B, t), or (B, offset + t) of which the last t columns are used) and the cache remembers the padding of
earlier keys.

Grouped-query attention (Ainslie et al. 2023): k and v have G = HeadLayout.kv_heads heads, G dividing H
(G = H: multi-head, G = 1: multi-query). Query head h attends with key/value head h // (H / G), the grouping
of Llama's `repeat_kv`. Kernels keep k and v with their G heads in caches and states (that is the memory
GQA saves) and expand them (`zoo.attention.functional.repeat_kv`) only where they compute.

Position bias: `bias`, when not None, is a `ScoreBias`, a callable

    bias(query_positions, key_positions) -> float tensor (..., H, Tq, Tk)

whose value is added to the scaled scores q . k / sqrt(D) before the softmax (ALiBi, T5's relative bias:
zoo/attention/biases.py). Positions are int64 token positions, absolute (the first token is 0; decoding
continues at the cache's offset), of shapes (..., Tq) and (..., Tk) with the same leading dims: a blockwise
kernel asks for all its blocks in one call ((n_blocks, block) queries, (n_blocks, keys) keys). Positions
outside the sequence (a block's padding, negative ones) may be asked for; those scores are masked anyway.
Full attention passes bias(arange(S - T, S), arange(S)) to SDPA as a float mask; local attention evaluates
it per query block. Only kernels with `supports_position_bias = True` are given one (linear attention has
no scores to add it to; AttentionConfig rejects the combination in one line).

Each kernel is a small `Kernel` (an nn.Module, so that a kernel may own buffers or parameters) built in two
steps: `Kernel(**options)` takes only the kernel's own options as keyword-only arguments and checks them
(one-line ValueError); `setup(layout)` then tells it about the model's token sequences and
`setup_heads(heads)` about the heads it will see (kernels that own per-head buffers or parameters, such as
FAVOR+'s random features or memory-compressed attention's per-head projections, create them there, so that
checkpoints load). What a kernel can do is said by class flags (`supports_causal`, `supports_cross_attention`,
`supports_position_bias`, `supports_decoding`, `supports_packing`: packed documents, zoo/attention/documents.py);
what it cannot do raises a one-line error. The options a kernel
accepts, and their defaults, are read off its constructor (AttentionConfig refuses another variant's from them),
and `example_options` names a few tiny sets of them that the test suite's variant tables (tests/variants.py) run
every generic test with. So adding a variant is one file, one
line in zoo/attention/registry.py and one conf/attention/<name>.yaml of its options: docs/adding-a-kernel.md.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from zoo.errors import ChoiceError


@runtime_checkable
class DecodingState(Protocol):
    """What a kernel keeps between decoding steps (a key/value cache, a rolling window, a recurrent state)."""

    offset: int  # tokens seen so far: the position of the next one

    def reorder(self, indices: torch.Tensor) -> None:
        """Keep the batch rows `indices` (beam search picks which hypotheses survive)."""


class ScoreBias(Protocol):
    """An additive score bias: int positions (..., Tq) and (..., Tk) -> float (..., H, Tq, Tk)."""

    def __call__(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionCall:
    """What one call of a kernel computes, beside q, k and v (the contract above).

    Args:
        causal: query i attends to keys up to its own position (the last T of the S keys).
        key_padding_mask: (B, S) bool, True where a key is padding; None: no padding.
        dropout_p: dropout on the attention probabilities (0 at inference).
        need_weights: also return the probabilities (B, H, T, S).
        bias: a ScoreBias added to the scaled scores, or None.
    """

    causal: bool = False
    key_padding_mask: torch.Tensor | None = None
    dropout_p: float = 0.0
    need_weights: bool = False
    bias: ScoreBias | None = None

    def replace(self, **changes: Any) -> AttentionCall:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Placement:
    """Where an attention sits in a model: what `AttentionConfig.validate`, the one place that refuses a
    combination the definitions rule out, decides by.

    Args:
        causal: a decoder's self-attention (each token sees the ones up to itself).
        cross: queries of one sequence over the keys and values of another (an encoder's output).
        grid: its tokens are image patches on a grid (TokenLayout.grid), not a sequence.
        packed: several documents packed per row, each attended alone (zoo/attention/documents.py).
    """

    causal: bool = False
    cross: bool = False
    grid: bool = False
    packed: bool = False


@dataclass(frozen=True)
class TokenLayout:
    """What a model tells its attention about the token sequences it attends over."""

    max_length: int | None = None  # the longest sequence (None: no limit, e.g. cross-attention memories)
    grid: tuple[int, int] | None = None  # image patches: the (rows, cols) grid, in row-major token order
    prefix_tokens: int = 0  # tokens before the grid (a class token); they sit at grid position (-1, -1)


@dataclass(frozen=True)
class HeadLayout:
    """What MultiHeadAttention tells its kernel about the heads: num_heads query heads, kv_heads key/value
    heads (grouped-query attention: kv_heads divides num_heads), head_dim channels each."""

    num_heads: int
    kv_heads: int
    head_dim: int


# attention.backend: how a kernel computes (auto: chosen by device; flex: torch's FlexAttention, compiled;
# blockwise: the kernel's own blocks through the fused SDPA kernel; sdpa: one SDPA call under the dense mask).
BACKENDS = ("auto", "flex", "blockwise", "sdpa")


class Kernel(nn.Module):
    """Base of the kernels in this package: the contract above, option discovery, `setup`, and the backend
    (`use_backend`; a kernel lists in `backends` the ones besides auto that it can be forced to)."""

    name: ClassVar[str] = ""
    supports_cross_attention: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_position_bias: ClassVar[bool] = False
    supports_decoding: ClassVar[bool] = True  # False: new_cache raises a one-line error saying why
    # Packed documents (zoo/attention/documents.py): the kernel run on each document alone is what packing means
    # for it. False where it is ill-defined (projections or clusters over the whole padded length).
    supports_packing: ClassVar[bool] = False
    # Grouped key/value heads compute what the repeated heads would (Llama's repeat_kv) and caches keep G heads;
    # False where a kernel keeps state per key/value head (routing's centroids) or keys are the queries (lsh).
    groups_as_repeated_heads: ClassVar[bool] = True
    backends: ClassVar[tuple[str, ...]] = ()
    # A few tiny option sets, small enough to matter on sequences of ~10-40 tokens: the suite's generic tests
    # (causality, padding, grouped heads, dropout, decoding, ... : tests/variants.py) run the kernel with each.
    example_options: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def __init__(self) -> None:
        super().__init__()
        self.backend = "auto"
        self._flex_masks: dict = {}  # FlexAttention block masks by (pattern, length, device): zoo/attention/flex.py

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_flex_masks": {}}  # a pickled kernel (spawned workers) rebuilds them

    def use_backend(self, backend: str) -> None:
        """Compute with `backend` (attention.backend): auto or one of `backends`, a one-line error otherwise."""
        valid = ("auto", *self.backends)
        if backend not in valid:
            raise ValueError(
                f"attention.backend={backend!r} is not available for variant {self.name!r}; its backends: "
                f"{', '.join(valid)}"
            )
        self.backend = backend

    def setup(self, layout: TokenLayout) -> None:
        """Learn the model's token layout (kernels that need a maximum length or a grid override this)."""
        self.layout = layout

    def notice(self) -> str | None:
        """One line a user should read about this kernel in this model (an option that makes it another kernel
        for the model's sequences), or None. `kernel_notices` collects them for the app to log."""
        return None

    def setup_heads(self, heads: HeadLayout) -> None:
        """Learn the heads' shape (kernels with buffers sized by head_dim override this)."""
        self.heads = heads

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The options this kernel accepts, with their defaults: its constructor's keyword-only arguments."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}

    @classmethod
    def option_choices(cls) -> dict[str, tuple[Any, ...]]:
        """The options with named choices (checked by zoo.errors.check_choice), each with its choices: read off the
        ChoiceError the constructor raises for a value that is none of them."""
        return named_choices(lambda name, value: cls(**{name: value}), cls.option_defaults())

    @classmethod
    def option_names(cls) -> list[str]:
        """The options this kernel accepts (`option_defaults`' names)."""
        return list(cls.option_defaults())

    def check_packing(self) -> None:
        """A one-line error where this kernel's options rule out packed documents (the class flag aside)."""

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.option_names() if hasattr(self, name)}

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.options().items())

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall | None = None, **arguments: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """kernel(q, k, v, call), or kernel(q, k, v, causal=True, ...): the keywords are an AttentionCall's."""
        return super().__call__(q, k, v, call if call is not None else AttentionCall(**arguments))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of q (B, H, T, D) over k, v (B, G, S, D) as `call` says -> (B, H, T, D), weights or None."""
        raise NotImplementedError

    def new_cache(self) -> DecodingState:
        """A fresh decoding state for `decode`."""
        raise NotImplementedError

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Any, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New queries (B, H, t, D) and keys/values (B, G, t, D), causal over the cache and themselves."""
        raise NotImplementedError


UNNAMED = object()  # a value no option has among its choices


def named_choices(build, names) -> dict[str, tuple[Any, ...]]:
    """{name: choices} of the settings in `names` that have named choices: `build(name, UNNAMED)` raises the
    ChoiceError of check_choice for them (any other error: a setting without named choices)."""
    found = {}
    for name in names:
        try:
            build(name, UNNAMED)
        except ChoiceError as error:
            found[name] = error.choices
        except (ValueError, TypeError):
            pass
    return found


def kernel_notices(model: nn.Module) -> list[str]:
    """The distinct `Kernel.notice` lines of the kernels in `model`, in module order."""
    lines = (module.notice() for module in model.modules() if isinstance(module, Kernel))
    return list(dict.fromkeys(line for line in lines if line))
