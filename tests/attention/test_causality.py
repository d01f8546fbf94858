"""Causal attention of every variant that has it: changing future tokens changes no earlier output."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention
from zoo.attention.registry import causal_variants

from .helpers import use_blockwise_path

OPTIONS = {  # small settings under which each pattern is far from full attention at 40 tokens
    "full": {},
    "local": {"window": 6, "chunk_size": 8},
    "linear": {"chunk_size": 8},
    "sparse": {"stride": 5},
    "axial": {"row_length": 6},
    "additive": {"chunk_size": 7},
}
CASES = [(variant, OPTIONS[variant], False) for variant in causal_variants()]
CASES.append(("sparse", {"pattern": "fixed", "stride": 6, "summary": 2}, False))
# The pattern kernels take a dense path below DENSE_MAX_LENGTH tokens: their blockwise one too.
CASES += [(variant, options, True) for variant, options, _ in CASES if variant in ("sparse", "axial")]


def test_every_causal_variant_is_covered() -> None:
    assert set(OPTIONS) == set(causal_variants())


@pytest.mark.parametrize(("variant", "options", "blockwise"), CASES)
def test_future_tokens_change_no_earlier_output(variant: str, options: dict, blockwise: bool, monkeypatch) -> None:
    if blockwise:
        use_blockwise_path(monkeypatch, fused=True)
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, variant=variant, causal=True, rope=True, **options)
    x = torch.randn(2, 40, 32, requires_grad=True)
    changed = x.detach().clone()
    changed[:, 25:] = torch.randn(2, 15, 32)
    out, other = module(x), module(changed)
    torch.testing.assert_close(other[:, :25], out[:, :25], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(other[:, 25:], out[:, 25:], atol=1e-3)
    # The same through gradients: no earlier output depends on a later input.
    out[:, 24].sum().backward()
    assert x.grad[:, 25:].abs().max() == 0 and x.grad[:, :25].abs().max() > 0
