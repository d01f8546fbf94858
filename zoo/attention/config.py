"""AttentionConfig: the settings of conf/attention/*.yaml, shared by every model.

Fields common to every variant (rotary positions, dropout) are named; everything else is an option of a
kernel (`window` for local, `chunk_size` for local and linear, ...) and lives in `options`. Options are
given flat, as the YAML files and the command line write them: `AttentionConfig(variant="local",
window=32)`. An option of another registered variant is carried but not used (a config may set local's
window for a sweep over every variant); an option no variant has is a one-line error naming the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.attention.registry import build_kernel, kernel_class, variant_options


@dataclass(init=False)
class AttentionConfig:
    variant: str = "full"
    rope: bool = False  # rotary positions on queries and keys (self-attention only), with any variant
    rope_base: float = 10000.0
    dropout: float = 0.0  # attention-probability dropout in training
    options: dict[str, Any] = field(default_factory=dict)  # the kernels' own options

    def __init__(
        self,
        variant: str = "full",
        rope: bool = False,
        rope_base: float = 10000.0,
        dropout: float = 0.0,
        options: dict[str, Any] | None = None,
        **kernel_options: Any,
    ) -> None:
        self.variant = variant
        self.rope = rope
        self.rope_base = rope_base
        self.dropout = dropout
        self.options = {**(options or {}), **kernel_options}
        self._check()

    def _check(self) -> None:
        kernel_class(self.variant)  # a one-line error for an unknown variant
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention.dropout must be in [0, 1), got {self.dropout!r}")
        known = {name for names in variant_options().values() for name in names}
        unknown = sorted(set(self.options) - known)
        if unknown:
            own = ", ".join(self.kernel_options()) or "none"
            raise ValueError(
                f"unknown attention option {unknown[0]!r}; options of variant {self.variant!r}: {own}; "
                f"of all variants: {', '.join(sorted(known))}"
            )
        self.build_kernel()  # checks the option values

    def kernel_options(self) -> dict[str, Any]:
        """The options given for the chosen variant (the kernel's defaults fill in the rest)."""
        names = kernel_class(self.variant).option_names()
        return {k: v for k, v in self.options.items() if k in names}

    def build_kernel(self, variant: str | None = None):
        """A fresh kernel of this config's variant (or of `variant`, e.g. a cross-attention's, without options)."""
        if variant is not None and variant != self.variant:
            return build_kernel(variant)
        return build_kernel(self.variant, **self.kernel_options())

    def to_dict(self) -> dict[str, Any]:
        """The flat form the YAML files use."""
        return {"variant": self.variant, "rope": self.rope, "rope_base": self.rope_base, "dropout": self.dropout,
                **self.options}  # fmt: skip

    def replace(self, **changes: Any) -> AttentionConfig:
        return AttentionConfig(**{**self.to_dict(), **changes})
