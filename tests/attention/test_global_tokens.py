"""Global tokens (Longformer, BigBird) on local and sparse attention and BigBird's random keys on sparse: exactly
softmax attention under the mask the definitions give, built here from loops and the kernel's random-key table,
computed blockwise (fused and explicit) in fp32 and fp64; decoding equals the whole-sequence forward."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention, TokenLayout
from zoo.attention.config import AttentionConfig
from zoo.attention.local import LocalAttention
from zoo.attention.sparse import SparseAttention

from .helpers import (
    assert_kernel_matches_masked_attention,
    banded_mask,
    random_padding,
    reference_softmax_attention,
    sparse_mask,
    use_blockwise_path,
)


def with_globals(allowed: torch.Tensor, global_tokens: int, causal: bool) -> torch.Tensor:
    """Longformer's global attention, with loops: the first g tokens attend to all, all attend to them."""
    allowed = allowed.clone()
    length = allowed.shape[0]
    for i in range(length):
        for j in range(length):
            if (i < global_tokens or j < global_tokens) and (j <= i or not causal):
                allowed[i, j] = True
    return allowed


def with_random(allowed: torch.Tensor, table: torch.Tensor, stride: int, causal: bool) -> torch.Tensor:
    """BigBird's random keys: query i also sees the keys its block of `stride` drew (table row i // stride)."""
    allowed = allowed.clone()
    for i in range(allowed.shape[0]):
        for j in table[i // stride].tolist():
            if j >= 0 and (j <= i or not causal):
                allowed[i, j] = True
    return allowed


def local_kernel(window: int, global_tokens: int) -> LocalAttention:
    kernel = LocalAttention(window=window, global_tokens=global_tokens, chunk_size=16)
    kernel.setup(TokenLayout())
    return kernel


def sparse_kernel(pattern: str, stride: int, global_tokens: int, random_keys: int) -> SparseAttention:
    kernel = SparseAttention(pattern=pattern, stride=stride, global_tokens=global_tokens, random_keys=random_keys)
    kernel.setup(TokenLayout())
    return kernel


def expected_mask(kernel, length: int, causal: bool) -> torch.Tensor:
    if isinstance(kernel, LocalAttention):
        allowed = banded_mask(length, kernel.window, causal)
    else:
        allowed = sparse_mask(length, kernel.pattern, kernel.step, kernel.summaries, causal)
        if kernel.random_keys:
            allowed = with_random(allowed, kernel.random_table(length, causal), kernel.step, causal)
    return with_globals(allowed, kernel.global_tokens, causal)


KERNELS = [
    ("local", lambda: local_kernel(9, 3)),
    ("local_wide", lambda: local_kernel(20, 5)),
    ("strided", lambda: sparse_kernel("strided", 6, 2, 0)),
    ("fixed_random", lambda: sparse_kernel("fixed", 7, 3, 3)),
    ("strided_random", lambda: sparse_kernel("strided", 5, 0, 4)),
]


@pytest.mark.parametrize("name", [name for name, _ in KERNELS])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_global_tokens_and_random_keys_match_masked_attention_fp32(name, causal, padded, fused, monkeypatch) -> None:
    use_blockwise_path(monkeypatch, fused)
    kernel = dict(KERNELS)[name]()
    assert_kernel_matches_masked_attention(kernel, expected_mask(kernel, 45, causal), causal, padded, seed=len(name))


@pytest.mark.parametrize("name", [name for name, _ in KERNELS])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dense", [True, False])
def test_global_tokens_and_random_keys_match_masked_attention_fp64(name, causal, dense, monkeypatch) -> None:
    """Outputs and input gradients at 1e-10 in fp64 (the explicit blockwise path, and the dense one), GQA."""
    if not dense:
        use_blockwise_path(monkeypatch, False)
    kernel = dict(KERNELS)[name]()
    length = 38
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, length, 8, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "kv")
    padding = random_padding(2, length, generator, left=causal)
    mask = expected_mask(kernel, length, causal)[None, None] & ~padding[:, None, None, :]
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    expected = reference_softmax_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,global_tokens", [(20, 5), (6, 12)])
def test_local_global_tokens_with_grouped_heads_match_masked_attention(causal, window, global_tokens, monkeypatch):
    """Grouped key/value heads, no padding (with the switch on: the band merged with the global rows and columns by
    log-sum-exp, zoo/attention/fast/band.py), global tokens fewer and more than the window."""
    use_blockwise_path(monkeypatch, True)
    kernel, length = local_kernel(window, global_tokens), 70
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, length, 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=True) for _ in "kv")
    out, _ = kernel(q, k, v, causal=causal)
    expected = reference_softmax_attention(q, k, v, expected_mask(kernel, length, causal)[None, None])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [name for name, _ in KERNELS])
def test_need_weights_are_zero_outside_the_pattern_and_sum_to_one(name) -> None:
    kernel = dict(KERNELS)[name]()
    q, k, v = (torch.randn(1, 2, 30, 8) for _ in range(3))
    _, weights = kernel(q, k, v, causal=True, need_weights=True)
    allowed = expected_mask(kernel, 30, True)
    assert (weights[..., ~allowed] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 30))


def test_random_keys_are_distinct_earlier_blocks_and_fixed_per_block() -> None:
    """A causal block b draws r distinct keys among the b * stride before it; the draw depends on b only (so the
    decoded and the whole-sequence forward agree), and a bidirectional block draws from the whole sequence."""
    kernel = sparse_kernel("strided", 8, 0, 5)
    short, long = kernel.random_table(40, True), kernel.random_table(100, True)
    torch.testing.assert_close(long[: len(short)], short)
    assert (short[0] == -1).all()
    for block, row in enumerate(long.tolist()):
        drawn = [j for j in row if j >= 0]
        assert len(drawn) == min(5, block * 8) and len(set(drawn)) == len(drawn)
        assert all(j < block * 8 for j in drawn)
    both = kernel.random_table(100, False)
    assert (both >= 0).all() and (both.max() >= 50) and (both < 100).all()


@pytest.mark.parametrize("variant,options", [("local", {"window": 6}), ("sparse", {"stride": 4, "random_keys": 2})])
def test_decoding_with_global_tokens_equals_the_forward(variant, options) -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(
        32, 4, variant=variant, causal=True, global_tokens=3, kv_heads=2, rope=True, **options
    ).eval()
    x = torch.randn(2, 21, 32)
    whole = module(x)
    cache = module.new_cache()
    steps = [module(x[:, :5], cache=cache)] + [module(x[:, i : i + 1], cache=cache) for i in range(5, 21)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_global_tokens_cost_o_of_n_g_memory_not_n_squared(monkeypatch) -> None:
    """No (n, n) tensor: the largest tensor of forward+backward grows linearly at fixed window and g."""
    from .helpers import largest_tensor

    use_blockwise_path(monkeypatch, True)
    sizes = [largest_tensor(local_kernel(16, 4), length, causal=True) for length in (512, 1024)]
    assert sizes[1] <= 2.2 * sizes[0] and sizes[1] < 1024 * 1024 / 4, sizes


def test_options_are_checked_in_one_line() -> None:
    for variant in ("local", "sparse"):
        with pytest.raises(ValueError, match="global_tokens.*int >= 0, got -1"):
            AttentionConfig(variant=variant, global_tokens=-1)
    with pytest.raises(ValueError, match="flex.*random keys"):
        AttentionConfig(variant="sparse", random_keys=2, backend="flex")
