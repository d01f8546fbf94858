"""FAVOR+ as Choromanski et al. 2021 define it: orthogonal random features whose estimate of exp(q . k) is
unbiased (QR's Q with R's signs fixed), and causal FAVOR+ equal to the linear-attention formula with the
textbook (unstabilised) features."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.attention import AttentionCall, HeadLayout, LinearAttention, orthogonal_random_features


def textbook_favor(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """Lemma 1: exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4)."""
    x = x / x.shape[-1] ** 0.25
    return torch.exp(x @ projection.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(projection.shape[0])


def favor_formula(q, k, v, projection, causal: bool) -> torch.Tensor:
    """phi(q_i) . sum_j phi(k_j) v_j / phi(q_i) . sum_j phi(k_j), over j <= i when causal: no eps."""
    similarity = textbook_favor(q, projection) @ textbook_favor(k, projection).transpose(-2, -1)
    if causal:
        similarity = similarity.tril()
    return similarity @ v / similarity.sum(-1, keepdim=True)


@pytest.mark.parametrize("direction", ["first_axis", "random"])
def test_orthogonal_random_features_estimate_exp_of_dot_product_without_bias(direction: str) -> None:
    """The mean of phi(q) . phi(k) over 2000 seeded draws of two blocks (m = 2d = 16) is exp(q . k / sqrt(d)),
    within 4 standard errors (~0.3%); the old draw (QR's Q without the sign correction) is off by ~5%."""
    dim, draws = 8, 2000
    generator = torch.Generator().manual_seed(0)
    if direction == "first_axis":
        q = torch.zeros(dim, dtype=torch.float64)
        q[0] = 0.3 * dim**0.25  # q' = q / d^(1/4) = 0.3 e_1
    else:
        q = torch.randn(dim, generator=generator, dtype=torch.float64)
        q = 0.3 * dim**0.25 * q / q.norm()
    k = q.clone()
    exact = math.exp(float(q @ k) / math.sqrt(dim))
    estimates = torch.stack(
        [
            (textbook_favor(q, w) * textbook_favor(k, w)).sum()
            for w in (orthogonal_random_features(2 * dim, dim, generator=generator).double() for _ in range(draws))
        ]
    )
    relative_error = float(estimates.mean()) / exact - 1
    standard_error = float(estimates.std()) / exact / math.sqrt(draws)
    assert abs(relative_error) < 4 * standard_error, (relative_error, standard_error)
    assert standard_error < 0.006  # the bound above is tight: an old-code bias of several percent fails it


def test_orthogonal_random_features_have_no_preferred_side() -> None:
    """Haar rows: the first coordinate of a block's first row is positive about half the time (it was never)."""
    generator = torch.Generator().manual_seed(1)
    first = torch.stack([orthogonal_random_features(4, 4, generator=generator)[0, 0] for _ in range(400)])
    assert 0.4 < float((first > 0).double().mean()) < 0.6


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [0.5, 2.0, 3.0])
def test_favor_equals_the_linear_attention_formula_in_fp64(causal: bool, scale: float) -> None:
    """out_i = sum_j phi(q_i) . phi(k_j) v_j / sum_j phi(q_i) . phi(k_j), the sums over j <= i when causal, with
    Lemma 1's features and the kernel's own random features: equal to 1e-10 in fp64 under both paths. At scale 2
    and 3 (scores q . k / sqrt(d) of a few units) many rows hold little total mass (down to ~1e-12): an additive
    eps in the normaliser moved them by up to 100% (causal) and 0.02-100% (bidirectional)."""
    torch.manual_seed(0)
    kernel = LinearAttention(feature_map="favor", num_features=32, chunk_size=8)
    kernel.setup_heads(HeadLayout(num_heads=2, kv_heads=1, head_dim=16))
    kernel = kernel.double().eval()
    generator = torch.Generator().manual_seed(2)
    q = scale * torch.randn(2, 2, 21, 16, generator=generator, dtype=torch.float64)
    k = scale * torch.randn(2, 1, 21, 16, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 1, 21, 16, generator=generator, dtype=torch.float64)
    out, _ = kernel(q, k, v, causal=causal)
    weights, _ = kernel(q, k, v, causal=causal, need_weights=True)  # the quadratic form (T, S)
    expected = favor_formula(q, k, v, kernel.projection, causal)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(weights, expected, atol=1e-10, rtol=1e-10)


def fp64_favor_case(heads: int, length: int, features: int, chunk: int, seed: int):
    """A FAVOR+ kernel in fp64 (one key/value head per query head, head dim 16) and its q, k, v (1, heads,
    length, 16), queries and keys at scale 2.5: scores of a few units, where an additive eps showed."""
    torch.manual_seed(0)
    kernel = LinearAttention(feature_map="favor", num_features=features, chunk_size=chunk)
    kernel.setup_heads(HeadLayout(num_heads=heads, kv_heads=heads, head_dim=16))
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, length, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    return kernel.double().eval(), (2.5 * q, 2.5 * k, v)


def test_favor_decoding_equals_the_formula_token_by_token_in_fp64() -> None:
    """Decoding one token at a time (the recurrent state [S | z]) gives the causal formula without eps: the first
    tokens, whose state holds one or two keys of small mass, included."""
    kernel, (q, k, v) = fp64_favor_case(heads=2, length=9, features=32, chunk=8, seed=3)
    cache = kernel.new_cache()
    one = AttentionCall()
    steps = [kernel.decode(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], cache, one)[0] for i in range(9)]
    expected = favor_formula(q, k, v, kernel.projection, causal=True)
    torch.testing.assert_close(torch.cat(steps, dim=2), expected, atol=1e-10, rtol=1e-10)


def test_long_causal_favor_equals_the_formula_in_fp64() -> None:
    """Past fast/linear.py's SEGMENT_LENGTH the fast path runs the sequence a segment at a time, with the prefix
    sums as row additions (64 features x 16 values per head reach SCAN_MIN_WIDTH): the formula without eps too."""
    kernel, (q, k, v) = fp64_favor_case(heads=1, length=2100, features=64, chunk=64, seed=4)
    with torch.no_grad():
        out, _ = kernel(q, k, v, causal=True)
    expected = favor_formula(q, k, v, kernel.projection, causal=True)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.fast_path
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bidirectional_favor_fast_path_equals_the_reference_path(dtype: torch.dtype, monkeypatch) -> None:
    """fast/linear.py's one-function FAVOR+ (hand-written backward, exp as exp2) against linear.py's reading path:
    the same outputs and gradients of q, k, v with grouped heads, cross-attention lengths, padded keys, and query
    and six keys along the longest feature w: their sum of phi(q) . phi(k) ~ 6 exp(|w|^2) / m overflows fp32 unless
    the queries' stabiliser (largest logit |w|^2 / 2 ~ 46, above fp32's limit ~22) scales the queries down."""
    from zoo.attention.fast import linear as fast_linear
    from zoo.attention.fast import set_fast_kernels

    torch.manual_seed(0)
    kernel = LinearAttention(feature_map="favor", num_features=80)
    kernel.setup_heads(HeadLayout(num_heads=4, kv_heads=2, head_dim=64))
    kernel = kernel.to(dtype).eval()
    generator = torch.Generator().manual_seed(5)
    q = 1.5 * torch.randn(2, 4, 19, 64, generator=generator, dtype=dtype)
    longest = kernel.projection[kernel.projection.norm(dim=1).argmax()] * 64**0.25  # x' = w
    q[:, :, :3] = longest
    k = 1.5 * torch.randn(2, 2, 11, 64, generator=generator, dtype=dtype)
    k[:, :, :6] = longest
    v = torch.randn(2, 2, 11, 8, generator=generator, dtype=dtype)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[0, -4:] = True
    grad = torch.randn(2, 4, 19, 8, generator=generator, dtype=dtype)
    calls = []
    original = fast_linear.favor_bidirectional
    monkeypatch.setattr(fast_linear, "favor_bidirectional", lambda *args: calls.append(1) or original(*args))
    results = {}
    for fast in (True, False):
        set_fast_kernels(fast)
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = kernel(*inputs, key_padding_mask=padding)
        results[fast] = (out, *torch.autograd.grad(out, inputs, grad))
    assert len(calls) == 1
    tolerance = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-4}
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, **tolerance)
    assert results[True][0].isfinite().all()
    assert results[True][2][0, :, -4:].abs().max() == 0  # padded keys get no gradient
