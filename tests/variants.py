"""The suite's variant tables, all read off the registry: every kernel of zoo.attention.registry.VARIANTS with
each of its `example_options`, kept or left out by its capability flags (supports_causal,
supports_cross_attention, supports_position_bias, supports_decoding, supports_packing). A kernel registered later
joins every table, and so every generic test, with no test file touched (tests/attention/test_toy_kernel.py shows
it)."""

from __future__ import annotations

from typing import Any

from zoo.attention import registry
from zoo.attention.pattern import PatternKernel


def case_id(variant: str, options: dict[str, Any]) -> str:
    """`sparse[pattern=fixed,stride=4,summary=2]`: the variant and its options, as a test id."""
    return variant + (f"[{','.join(f'{key}={value}' for key, value in options.items())}]" if options else "")


def kernel_cases(
    *,
    causal: bool = False,
    cross_attention: bool = False,
    position_bias: bool = False,
    decoding: bool = False,
    grouped: bool = False,
    packing: bool = False,
    first_only: bool = False,
) -> list[tuple[str, dict[str, Any]]]:
    """(variant, options) of every registered kernel and each of its example options (its first only with
    first_only), for the kernels that have every capability asked for (decoding: causal and a cache; grouped: grouped
    key/value heads equal to the repeated heads)."""
    cases = []
    for name, kernel in registry.VARIANTS.items():
        wanted = (
            (not causal or kernel.supports_causal)
            and (not cross_attention or kernel.supports_cross_attention)
            and (not position_bias or kernel.supports_position_bias)
            and (not decoding or (kernel.supports_causal and kernel.supports_decoding))
            and (not grouped or kernel.groups_as_repeated_heads)
            and (not packing or kernel.supports_packing)
        )
        if wanted:
            examples = kernel.example_options[:1] if first_only else kernel.example_options
            cases += [(name, dict(options)) for options in examples]
    return cases


def settings_cases(**capabilities: bool) -> dict[str, dict[str, Any]]:
    """{name: flat attention settings ({"variant": ..., **options})} of `kernel_cases(**capabilities)`: a kernel's
    first example is named by the variant alone (`local`), the others by `case_id`."""
    cases: dict[str, dict[str, Any]] = {}
    for variant, options in kernel_cases(**capabilities):
        cases[variant if variant not in cases else case_id(variant, options)] = {"variant": variant, **options}
    return cases


def is_pattern_kernel(variant: str) -> bool:
    """A kernel of zoo/attention/blockwise.py's PatternKernel: a dense path for short sequences and a blockwise one."""
    return issubclass(registry.VARIANTS[variant], PatternKernel)


def takes(variant: str, option: str) -> bool:
    """The kernel declares `option` (a keyword-only argument of its constructor)."""
    return option in registry.VARIANTS[variant].option_names()


def supports(variant: str, capability: str) -> bool:
    """The kernel's flag `supports_<capability>` (causal, cross_attention, position_bias, decoding, packing)."""
    return getattr(registry.VARIANTS[variant], f"supports_{capability}")
