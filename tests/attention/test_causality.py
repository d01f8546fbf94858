"""Causal attention of every variant that has it: changing future tokens changes no earlier output."""

from __future__ import annotations

import pytest
import torch

from tests.variants import is_pattern_kernel, kernel_cases
from zoo.attention import MultiHeadAttention

from .helpers import use_blockwise_path

CASES = [(variant, options, False) for variant, options in kernel_cases(causal=True)]
# The pattern kernels take a dense path below DENSE_MAX_LENGTH tokens: their blockwise one too.
CASES += [(variant, options, True) for variant, options, _ in CASES if is_pattern_kernel(variant)]


@pytest.mark.parametrize(("variant", "options", "blockwise"), CASES)
def test_future_tokens_change_no_earlier_output(variant: str, options: dict, blockwise: bool, monkeypatch) -> None:
    if blockwise:
        use_blockwise_path(monkeypatch, fused=True)
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, variant=variant, causal=True, rope=True, **options).eval()  # one draw (lsh)
    x = torch.randn(2, 40, 32, requires_grad=True)
    changed = x.detach().clone()
    changed[:, 25:] = torch.randn(2, 15, 32)
    out, other = module(x), module(changed)
    torch.testing.assert_close(other[:, :25], out[:, :25], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(other[:, 25:], out[:, 25:], atol=1e-3)
    # The same through gradients: no earlier output depends on a later input.
    out[:, 24].sum().backward()
    assert x.grad[:, 25:].abs().max() == 0 and x.grad[:, :25].abs().max() > 0
