"""AttentionConfig: the settings of conf/attention/*.yaml, shared by every model.

Two kinds of settings, by what they configure:
- Fields configure MultiHeadAttention itself and so apply with every variant: the positions it adds to
  queries and keys (`rope`, `rope_base`, `rope_scaling`, `rope_factor`), the position bias it hands to the
  kernel (`position_bias`, and T5's `num_buckets`, `max_distance`, `share_bias`), the shape of its heads
  (`kv_heads`), attention `dropout`, and the `backend` that computes the kernel (auto: by device; flex,
  blockwise, sdpa: forced, zoo/attention/contract.py BACKENDS). The dataclass fields below are their one list;
  conf/attention/base/settings.yaml writes them once for every variant's yaml.
- Options configure one kernel (`window` for local, `chunk_size` for local and linear, `feature_map` for
  linear, ...) and live in `options`; each conf/attention/<variant>.yaml lists its own variant's.
Options are given flat, as the YAML files and the command line write them: `AttentionConfig(variant="local",
window=32)`. Each kernel declares its options once, as its constructor's keyword-only arguments with their
defaults (Kernel.option_defaults); from those alone `_check` refuses, in one line, an option of another variant
set to anything but its default there (`attention.window=32 is an option of local, not of
attention.variant=full; ...`): it would change nothing. At its default it is carried but not used (a yaml
may write every variant's defaults), and so are T5's fields without position_bias=t5 and rope_factor without a
rope_scaling; an option no variant has is a one-line error naming the valid ones, and so is a combination the
definitions do not allow (a position bias with a kernel that has no scores, RoPE scaling without RoPE).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from torch import nn

from zoo.attention.biases import POSITION_BIASES, build_position_bias, check_bucketing
from zoo.attention.contract import BACKENDS, Placement, named_choices
from zoo.attention.positions import ROPE_SCALINGS, check_rope_parameters
from zoo.attention.registry import (
    VARIANTS,
    build_kernel,
    causal_variants,
    cross_attention_variants,
    kernel_class,
    option_takers,
    packing_variants,
)
from zoo.errors import PlacementError, check_choice, check_positive_int


@dataclass(init=False)
class AttentionConfig:
    variant: str = "full"
    rope: bool = False  # rotary positions on queries and keys (self-attention only), with any variant
    rope_base: float = 10000.0
    rope_scaling: str | None = None  # linear | ntk | dynamic | yarn | llama3: RoPE past the trained length (needs rope)
    rope_factor: float = 1.0  # the scaling factor s of rope_scaling
    rope_parameters: dict[str, Any] | None = None  # yarn, llama3: their further settings (transformers' names)
    position_bias: str | None = None  # alibi | t5: a relative bias on the scores (self-attention only)
    num_buckets: int = 32  # t5: distance buckets
    max_distance: int = 128  # t5: distances from here on share the last bucket
    share_bias: bool = True  # t5: one bias for all layers of a stack (T5) or one per layer
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: one per query head
    dropout: float = 0.0  # attention-probability dropout in training
    backend: str = "auto"  # auto | flex | blockwise | sdpa (each variant lists the ones it has)
    options: dict[str, Any] = field(default_factory=dict)  # the kernels' own options

    def __init__(self, *args: Any, options: dict[str, Any] | None = None, **settings: Any) -> None:
        # The fields above are the one list of settings: the arguments fill them by name (or in their order),
        # the rest are the kernels' options, given flat.
        fields_ = [f for f in fields(self) if f.name != "options"]
        if len(args) > len(fields_):
            raise TypeError(f"AttentionConfig takes at most {len(fields_)} positional arguments, got {len(args)}")
        for f, value in zip(fields_, args):
            if f.name in settings:
                raise TypeError(f"AttentionConfig got multiple values for argument {f.name!r}")
            settings[f.name] = value
        for f in fields_:
            default = f.default_factory() if f.default is MISSING else f.default
            setattr(self, f.name, settings.pop(f.name, default))
        self.options = {**(options or {}), **settings}
        if self.rope_parameters:  # a plain dict, also when Hydra hands a DictConfig
            self.rope_parameters = dict(self.rope_parameters)
        self._check()

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        """The settings of MultiHeadAttention itself (every field but `options`), as conf/attention/ writes them."""
        return tuple(f.name for f in fields(cls) if f.name != "options")

    @classmethod
    def setting_choices(cls) -> dict[str, tuple[Any, ...]]:
        """The settings with named choices (rope_scaling, position_bias, backend), each with its choices."""
        return named_choices(lambda name, value: cls(**{name: value}), cls.setting_names())

    def _check(self) -> None:
        kernel = kernel_class(self.variant)  # a one-line error for an unknown variant
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention.dropout must be in [0, 1), got {self.dropout!r}")
        if self.rope_scaling is not None:
            check_choice("attention.rope_scaling", self.rope_scaling, ROPE_SCALINGS)
            if not self.rope:
                raise ValueError(
                    f"attention.rope_scaling={self.rope_scaling!r} scales RoPE: it needs attention.rope=true"
                )
        check_rope_parameters(self.rope_scaling, self.rope_parameters)
        if isinstance(self.rope_factor, bool) or not isinstance(self.rope_factor, (int, float)) or self.rope_factor < 1:
            raise ValueError(f"attention.rope_factor must be a number >= 1, got {self.rope_factor!r}")
        if self.rope_scaling in ("linear", "ntk") and self.rope_factor == 1:
            raise ValueError(
                f"attention.rope_scaling={self.rope_scaling!r} with attention.rope_factor=1 is plain RoPE; give "
                "attention.rope_factor > 1 (e.g. the ratio of the longest length to the trained one)"
            )
        if self.position_bias is not None:
            check_choice("attention.position_bias", self.position_bias, POSITION_BIASES)
            if not kernel.supports_position_bias:
                takers = sorted(name for name, k in VARIANTS.items() if k.supports_position_bias)
                raise ValueError(
                    f"attention.position_bias={self.position_bias!r} adds to attention scores, which variant "
                    f"{self.variant!r} never forms; variants that take a position bias: {takers}"
                )
        if self.position_bias == "t5":
            check_bucketing(self.num_buckets, self.max_distance)
        if not isinstance(self.share_bias, bool):
            raise ValueError(f"attention.share_bias must be true or false, got {self.share_bias!r}")
        check_positive_int("attention.kv_heads", self.kv_heads, allow_none=True)
        check_choice("attention.backend", self.backend, BACKENDS)
        if self.backend == "flex" and (self.position_bias is not None or self.dropout > 0):
            raise ValueError(
                "attention.backend='flex' takes no position_bias and no dropout (FlexAttention here has neither), "
                f"got position_bias={self.position_bias!r}, dropout={self.dropout!r}; use backend=auto or blockwise"
            )
        takers = option_takers()
        own = ", ".join(kernel.option_names()) or "none"
        unknown = sorted(set(self.options) - set(takers))
        if unknown:
            raise ValueError(
                f"unknown attention option {unknown[0]!r}; options of variant {self.variant!r}: {own}; "
                f"of all variants: {', '.join(sorted(takers))}"
            )
        for name, value in self.options.items():
            variants = takers[name]
            if self.variant not in variants and not any(is_default(value, d) for d in variants.values()):
                raise ValueError(
                    f"attention.{name}={value!r} is an option of {', '.join(variants)}, not of "
                    f"attention.variant={self.variant}; its options: {own}"
                )
        self.build_kernel()  # checks the option values and the backend

    def validate(self, placement: Placement) -> None:
        """Refuse, in one line, what this attention cannot do where it sits: the one place for such refusals
        (the settings alone are checked as the config is made). A PlacementError says what the option needs
        ("bidirectional", "sequence"), so that the command line can name where it fits instead."""
        kernel = kernel_class(self.variant)
        if placement.causal and not kernel.supports_causal:
            raise PlacementError(
                f"attention variant {self.variant!r} is bidirectional only, and this self-attention is causal; "
                f"valid choices: {causal_variants()}",
                "variant", self.variant, needs="bidirectional",
            )  # fmt: skip
        if placement.cross and not kernel.supports_cross_attention:
            raise ValueError(
                f"cross-attention is not supported by variant {self.variant!r}; valid choices: "
                f"{cross_attention_variants()}"
            )
        if placement.cross and (self.rope or self.position_bias is not None):
            bias = f"attention.position_bias={self.position_bias}"
            setting = "attention.rope=true (attention=rope)" if self.rope else bias
            raise ValueError(f"{setting} would be ignored: a cross-attention has no positions across its two sequences")
        if placement.grid and self.position_bias is not None:
            raise PlacementError(
                f"attention.position_bias={self.position_bias!r} biases distances along a token sequence; "
                "a patch grid (ViT) takes attention.rope=true for its 2-D positions",
                "position_bias", self.position_bias, needs="sequence",
            )  # fmt: skip
        if placement.packed:
            if not kernel.supports_packing:
                raise ValueError(
                    f"packed documents are not supported by attention variant {self.variant!r}; valid choices: "
                    f"{packing_variants()}"
                )
            self.build_kernel().check_packing()  # what the kernel's options rule out

    @property
    def relative_positions(self) -> bool:
        """Positions act inside attention (RoPE or a position bias): models add no absolute position table."""
        return self.rope or self.position_bias is not None

    @property
    def extrapolates(self) -> bool:
        """Made for sequences longer than the trained length (a position bias, or RoPE with a length scaling):
        models then take them, and their max_length is the trained length, not a limit."""
        return self.position_bias is not None or self.rope_scaling is not None

    def kernel_options(self) -> dict[str, Any]:
        """The options given for the chosen variant (the kernel's defaults fill in the rest)."""
        names = kernel_class(self.variant).option_names()
        return {k: v for k, v in self.options.items() if k in names}

    def build_kernel(self, variant: str | None = None):
        """A fresh kernel of this config's variant (or of `variant`, e.g. a cross-attention's, without options)."""
        if variant is not None and variant != self.variant:
            return build_kernel(variant)
        kernel = build_kernel(self.variant, **self.kernel_options())
        kernel.use_backend(self.backend)
        return kernel

    def build_position_bias(self, num_heads: int, causal: bool) -> nn.Module | None:
        """A fresh position bias module for `num_heads` heads, or None without position_bias."""
        if self.position_bias is None:
            return None
        return build_position_bias(
            self.position_bias, num_heads, causal=causal, num_buckets=self.num_buckets, max_distance=self.max_distance
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat form the YAML files use."""
        return {**{name: getattr(self, name) for name in self.setting_names()}, **self.options}

    def replace(self, **changes: Any) -> AttentionConfig:
        """This config with `changes`; another variant leaves behind the options of this one that it does not take."""
        settings = self.to_dict()
        if changes.get("variant", self.variant) != self.variant:
            takes = kernel_class(changes["variant"]).option_names()
            settings = {k: v for k, v in settings.items() if k not in self.options or k in takes}
        return AttentionConfig(**{**settings, **changes})


def is_default(value: Any, default: Any) -> bool:
    """`value` is the option's default (a bool is not the int it equals: global_tokens=false is no default 0)."""
    return isinstance(value, bool) == isinstance(default, bool) and value == default
