"""Sparse Transformer attention is exactly softmax attention under the paper's strided / fixed masks, computed
blockwise without an (n, n) tensor; the blockwise machinery takes an additive score bias (for ALiBi)."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention, TokenLayout
from zoo.attention import blockwise as blockwise_module
from zoo.attention.functional import softmax_attention
from zoo.attention.sparse import BAND_BLOCK_SIZE, SparseAttention

from .helpers import (
    assert_kernel_matches_masked_attention,
    largest_tensor,
    random_padding,
    reference_softmax_attention,
    sparse_mask,
    use_blockwise_path,
)

CASES = [  # (pattern, length, stride, summary): n a multiple of the stride or not, stride > n, extremes
    ("strided", 50, 7, None),
    ("strided", 64, 8, None),
    ("strided", 37, 64, None),
    ("strided", 45, 1, None),
    ("strided", 70, 5, None),
    ("strided", 150, 64, None),  # band windows of whole query blocks (fast.blocks._BlockWindows)
    ("fixed", 50, 7, 2),
    ("fixed", 64, 8, 1),
    ("fixed", 37, 64, 3),
    ("fixed", 23, 5, 5),
    ("fixed", 70, 4, 3),
]


def sparse_kernel(pattern: str, stride: int, summary: int | None) -> SparseAttention:
    kernel = SparseAttention(pattern=pattern, stride=stride, summary=summary)
    kernel.setup(TokenLayout())
    return kernel


# Every case causal and not, padded and not, on the fused path; two also on the explicit one (the path of
# attention dropout, learned biases and non-CPU devices).
MATRIX = [(*case, padded, causal, True) for case in CASES for padded in (False, True) for causal in (True, False)]
MATRIX += [(*case, True, causal, False) for case in (CASES[0], CASES[5]) for causal in (True, False)]


@pytest.mark.parametrize(("pattern", "length", "stride", "summary", "padded", "causal", "fused"), MATRIX)
def test_sparse_attention_matches_masked_full_attention(
    pattern: str, length: int, stride: int, summary: int | None, padded: bool, causal: bool, fused: bool, monkeypatch
) -> None:
    use_blockwise_path(monkeypatch, fused)
    allowed = sparse_mask(length, pattern, stride, summary or 0, causal)
    kernel = sparse_kernel(pattern, stride, summary)
    assert_kernel_matches_masked_attention(kernel, allowed, causal, padded, seed=length * stride)


def test_dense_path_for_short_sequences_equals_the_blockwise_one(monkeypatch) -> None:
    kernel = sparse_kernel("strided", 6, None)
    q, k, v = (torch.randn(2, 2, 40, 8) for _ in range(3))
    padding = random_padding(2, 40, torch.Generator().manual_seed(0))
    assert blockwise_module.DENSE_MAX_LENGTH >= 40
    dense, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)
    use_blockwise_path(monkeypatch, fused=True)
    blockwise, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)
    torch.testing.assert_close(dense, blockwise, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_sparse_module_weights_are_the_pattern_probabilities(pattern: str) -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="sparse", pattern=pattern, stride=4, causal=True)
    x = torch.randn(1, 19, 16)
    out, weights = module(x, need_weights=True)
    summary = module.kernel.summaries
    assert torch.equal(weights[0, 0] > 0, sparse_mask(19, pattern, 4, summary, causal=True))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 19))
    torch.testing.assert_close(module(x), out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_sparse_attention_never_materialises_n_by_n(pattern: str, monkeypatch) -> None:
    use_blockwise_path(monkeypatch, fused=True)
    length, stride = 1024, 32  # stride = sqrt(n)
    largest = largest_tensor(sparse_kernel(pattern, stride, 2 if pattern == "fixed" else None), length, causal=True)
    # strided: blocks of queries x (block + stride) keys; fixed: n queries x the n / stride * 2 summaries.
    bound = length * (BAND_BLOCK_SIZE + stride + 1) if pattern == "strided" else length * (2 * length // stride + 2)
    assert largest <= bound < length * length // 8, largest


def test_default_stride_and_summary_follow_the_max_length() -> None:
    kernel = SparseAttention(pattern="fixed")
    kernel.setup(TokenLayout(max_length=64))
    assert (kernel.step, kernel.summaries) == (8, 1)
    kernel.setup(TokenLayout(max_length=4097))
    assert (kernel.step, kernel.summaries) == (65, 8)


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"pattern": "dilated"}, ["'dilated'", "fixed, strided"]),
        ({"stride": 0}, ["stride", "0", "positive int"]),
        ({"pattern": "fixed", "summary": -1}, ["summary", "-1"]),
        ({"summary": 2}, ["summary", "'fixed' only"]),
        ({"pattern": "fixed", "stride": 4, "summary": 5}, ["summary", "at most", "stride=4"]),
    ],
)
def test_sparse_options_are_checked(options: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(16, 2, variant="sparse", **options)
    assert "\n" not in str(info.value) and all(f in str(info.value) for f in fragments), info.value


def test_sparse_needs_a_stride_or_the_max_length() -> None:
    with pytest.raises(ValueError, match="attention.stride .* max length"):
        MultiHeadAttention(16, 2, variant="sparse")
    assert MultiHeadAttention(16, 2, variant="sparse", layout=TokenLayout(max_length=100)).kernel.step == 10


def alibi(slopes: torch.Tensor):
    """ALiBi's bias -slope_h * |i - j| (Press et al. 2022), as a function of positions."""

    def bias(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        distance = (query_positions[..., None, :, None] - key_positions[..., None, None, :]).abs()
        return -slopes[:, None, None] * distance

    return bias


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("variant", ["strided", "fixed"])
def test_blockwise_parts_add_a_score_bias_before_the_softmax(variant: str, fused: bool, monkeypatch) -> None:
    use_blockwise_path(monkeypatch, fused)
    length, causal = 45, variant == "strided"
    kernel = sparse_kernel(variant, 6, 2 if variant == "fixed" else None)
    slopes = torch.tensor([0.5, 0.125], requires_grad=not fused)  # a learned bias takes the explicit path
    torch.manual_seed(0)  # fixed inputs: the slopes' fp32 gradient sums many terms and an unlucky draw missed 1e-4
    q, k, v = (torch.randn(2, 2, length, 8, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, torch.Generator().manual_seed(1))
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=alibi(slopes))
    positions = torch.arange(length)
    allowed = sparse_mask(length, variant, 6, 2, causal)[None, None] & ~padding[:, None, None, :]
    additive = alibi(slopes)(positions, positions).masked_fill(~allowed, float("-inf"))
    expected, _ = softmax_attention(q, k, v, additive)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    inputs = (q, k, v) if fused else (q, k, v, slopes)
    grad = torch.randn(out.shape)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        # The slopes' gradient sums B * H * n * n terms: relative 1e-4.
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5 if got.ndim > 1 else 1e-4)
    # The dense path (need_weights) adds the same bias.
    dense, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=alibi(slopes),
                                   need_weights=True)  # fmt: skip
    torch.testing.assert_close(dense, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(weights > 0, allowed.expand_as(weights))


def test_queries_without_any_key_output_zeros_and_finite_gradients(monkeypatch) -> None:
    use_blockwise_path(monkeypatch, fused=True)
    kernel = sparse_kernel("strided", 4, None)
    q, k, v = (torch.randn(1, 2, 30, 8, requires_grad=True) for _ in range(3))
    padding = torch.zeros(1, 30, dtype=torch.bool)
    padding[0, :10] = True  # causal: the first 10 queries see only padding
    out, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)
    assert out[0, :, :10].abs().max() == 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    expected = reference_softmax_attention(
        q, k, v, sparse_mask(30, "strided", 4, 0, True)[None, None] & ~padding[:, None, None, :]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("left", "right", "length"), [(16, 0, 50), (8, 8, 56), (0, 0, 13)])
def test_whole_block_windows_backpropagate_like_the_strided_view(left: int, right: int, length: int) -> None:
    x = torch.randn(2, 3, length, 4, requires_grad=True)
    n_blocks = -(-length // 8)
    windows = blockwise_module.blocked_windows(x, left, right, 8, n_blocks)  # the block-by-block backward
    reference = blockwise_module._windows(x, left, right, 8, n_blocks)  # autograd through unfold
    torch.testing.assert_close(windows, reference)
    # Window entries outside the sequence (always masked keys) get no gradient: the two then agree.
    positions = torch.arange(n_blocks)[:, None] * 8 - left + torch.arange(left + 8 + right)
    outside = ((positions < 0) | (positions >= length)).repeat(2, 1)[:, None, :, None]
    grad = torch.randn(windows.shape).masked_fill(outside, 0.0)
    got, want = torch.autograd.grad(windows, x, grad)[0], torch.autograd.grad(reference, x, grad)[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
