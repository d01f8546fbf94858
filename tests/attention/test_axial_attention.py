"""Axial attention is exactly softmax attention under the row + column mask, for 1-D sequences folded into
rows and for the patch grids (with class tokens) that models give it; blockwise, without an (n, n) tensor."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention, TokenLayout
from zoo.attention.axial import AxialAttention

from .helpers import assert_kernel_matches_masked_attention, axial_mask, largest_tensor, use_blockwise_path

CASES = [  # (length, row_length or None, grid or None, prefix tokens)
    (7, 3, None, 0),  # a partial last row
    (16, 4, None, 0),
    (23, 5, None, 0),
    (6, 1, None, 0),  # one column: causal axial is full causal attention
    (5, 8, None, 0),  # one row
    (13, None, (3, 4), 1),  # a ViT: class token + 3 x 4 patches
    (18, None, (4, 4), 2),  # two prefix tokens
    (6, None, (2, 3), 0),
]


def axial_kernel(row_length: int | None, grid: tuple[int, int] | None, prefix: int) -> AxialAttention:
    kernel = AxialAttention(row_length=row_length)
    kernel.setup(TokenLayout(grid=grid, prefix_tokens=prefix))
    return kernel


# Every case causal and not, padded and not, on the fused path; two also on the explicit one.
MATRIX = [(*case, padded, causal, True) for case in CASES for padded in (False, True) for causal in (True, False)]
MATRIX += [(*case, True, causal, False) for case in (CASES[2], CASES[6]) for causal in (True, False)]


@pytest.mark.parametrize(("length", "row_length", "grid", "prefix", "padded", "causal", "fused"), MATRIX)
def test_axial_attention_matches_masked_full_attention(
    length: int, row_length, grid, prefix: int, padded: bool, causal: bool, fused: bool, monkeypatch
) -> None:
    use_blockwise_path(monkeypatch, fused)
    kernel = axial_kernel(row_length, grid, prefix)
    assert_kernel_matches_masked_attention(
        kernel, axial_mask(length, row_length or grid[1], prefix, causal), causal, padded, seed=length
    )


def test_axial_module_follows_the_models_patch_grid() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="axial", layout=TokenLayout(max_length=13, grid=(3, 4), prefix_tokens=1))
    x = torch.randn(2, 13, 16)
    out, weights = module(x, need_weights=True)
    assert torch.equal(weights[0, 0] > 0, axial_mask(13, 4, 1, causal=False))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 13))
    torch.testing.assert_close(module(x), out, atol=1e-5, rtol=1e-5)


def test_axial_row_length_folds_a_sequence_and_defaults_to_its_square_root() -> None:
    assert axial_kernel(5, None, 0).width == 5
    kernel = AxialAttention()
    kernel.setup(TokenLayout(max_length=64))
    assert kernel.width == 8
    kernel.setup(TokenLayout(max_length=65))
    assert kernel.width == 9


@pytest.mark.parametrize("causal", [True, False])
def test_axial_attention_never_materialises_n_by_n(causal: bool, monkeypatch) -> None:
    use_blockwise_path(monkeypatch, fused=True)
    length, width = 1024, 32
    largest = largest_tensor(axial_kernel(width, None, 0), length, causal)
    assert largest <= length * 2 * width < length * length // 8, largest  # n x (row + column)


def test_axial_options_are_checked() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="row_length"):
            AxialAttention(row_length=bad)
    with pytest.raises(ValueError, match=r"row_length=3 does not fit the model's 4x4 patch grid.*null or 4"):
        MultiHeadAttention(16, 2, variant="axial", row_length=3, layout=TokenLayout(max_length=17, grid=(4, 4)))
    with pytest.raises(ValueError, match="attention.row_length .* max length or grid"):
        MultiHeadAttention(16, 2, variant="axial")
