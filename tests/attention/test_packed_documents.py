"""MultiHeadAttention over packed documents equals each document attended alone, for every registered kernel that
supports packing (tests/variants.py, from the registry), causal and bidirectional, with grouped key/value heads (the
documents' own padding is key padding); runs with the fast-kernels switch on and off (conftest)."""

from __future__ import annotations

import pytest
import torch

from tests.variants import case_id, kernel_cases, supports
from zoo.attention import MultiHeadAttention, PackedDocuments, TokenLayout

LENGTHS = [[4, 1, 7, 4], [9, 7]]  # two rows of 16 tokens


def _cases(causal: bool) -> list:
    return [
        pytest.param(variant, options, id=case_id(variant, options))
        for variant, options in kernel_cases(packing=True, causal=causal)
        if not options.get("random_keys")  # refused in one line (tests/models/test_packing.py)
    ]


def _attention(variant, options, causal, **settings) -> MultiHeadAttention:
    torch.manual_seed(0)
    module = MultiHeadAttention(
        16, 4, variant=variant, causal=causal, kv_heads=2, layout=TokenLayout(max_length=16), **options, **settings
    )
    return module.double().eval()


def _check(module: MultiHeadAttention) -> None:
    x = torch.randn(2, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ids = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in LENGTHS])
    with torch.no_grad():
        packed = module(x, documents=PackedDocuments.from_ids(ids))
        for row, lengths in enumerate(LENGTHS):
            start = 0
            for n in lengths:
                alone = module(x[row : row + 1, start : start + n])[0]
                torch.testing.assert_close(packed[row, start : start + n], alone, rtol=1e-10, atol=1e-10)
                start += n


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("variant", "options"), _cases(causal=False))
def test_packed_documents_attend_as_if_alone(variant, options, causal):
    if causal and not supports(variant, "causal"):
        pytest.skip(f"{variant} is bidirectional only")
    _check(_attention(variant, options, causal))


@pytest.mark.parametrize(("variant", "options"), _cases(causal=True))
def test_positions_restart_per_document_with_rope_and_alibi(variant, options):
    _check(_attention(variant, options, True, rope=True))
    if supports(variant, "position_bias"):
        _check(_attention(variant, options, True, position_bias="alibi"))
