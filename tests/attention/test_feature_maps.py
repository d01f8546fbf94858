"""Linear attention's other feature maps: ReLU, and FAVOR+ random features, which converge to softmax attention
as they grow, compute the same in prefix-sum and quadratic form, and are redrawn in training only."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.attention import HeadLayout, LinearAttention, MultiHeadAttention, orthogonal_random_features
from zoo.attention.functional import softmax_attention

from .helpers import random_padding


def favor_kernel(num_features: int, head_dim: int = 16, seed: int = 0, **options) -> LinearAttention:
    torch.manual_seed(seed)
    kernel = LinearAttention(feature_map="favor", num_features=num_features, **options)
    kernel.setup_heads(HeadLayout(num_heads=2, kv_heads=2, head_dim=head_dim))
    return kernel.eval()


def textbook_favor(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """Choromanski et al. 2021, Lemma 1: exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4), unstabilised."""
    x = x / x.shape[-1] ** 0.25
    return torch.exp(x @ projection.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(projection.shape[0])


@pytest.mark.parametrize("causal", [False, True])
def test_favor_estimate_of_softmax_attention_improves_with_more_features(causal: bool) -> None:
    """Mean absolute error of the output against softmax attention (these inputs, mean over 4 seeds of the
    features), measured:

        features         16      64      256     1024
        bidirectional    0.069   0.052   0.036   0.022
        causal           0.089   0.062   0.045   0.029

    (python: this test's inputs and favor_kernel per seed); the error about halves for 16x the features."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (0.7 * torch.randn(2, 2, 48, 16, generator=generator) for _ in range(3))
    allowed = torch.ones(48, 48, dtype=torch.bool).tril() if causal else None
    exact, _ = softmax_attention(q, k, v, allowed)

    def error(num_features: int) -> float:
        errors = [
            (favor_kernel(num_features, seed=s)(q, k, v, causal=causal)[0] - exact).abs().mean() for s in range(4)
        ]
        return float(torch.stack(errors).mean())

    few, many = error(16), error(256)
    assert many < 0.75 * few, (few, many)  # a clear margin (measured: about 0.5x), not just "smaller"


@pytest.mark.parametrize("feature_map", ["relu", "favor"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_prefix_sum_form_equals_quadratic_form(feature_map: str, causal: bool, padded: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 29, 16, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, 29, generator) if padded else None
    kernel = (
        favor_kernel(24, chunk_size=8) if feature_map == "favor" else LinearAttention(feature_map="relu", chunk_size=8)
    )
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    quadratic, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, need_weights=True)
    torch.testing.assert_close(out, quadratic, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(quadratic, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The textbook formulas, written out: phi(q) . phi(k) normalised over the attended keys.
    phi_q, phi_k = (
        (textbook_favor(t, kernel.projection) for t in (q, k)) if feature_map == "favor" else (q.relu(), k.relu())
    )
    similarity = phi_q @ phi_k.transpose(-2, -1)
    if causal:
        similarity = similarity.tril()
    if padding is not None:
        similarity = similarity * ~padding[:, None, None, :]
    expected = similarity @ v / (similarity.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.no_fast_path
def test_favor_features_are_positive_orthogonal_and_gaussian_sized() -> None:
    torch.manual_seed(0)
    projection = orthogonal_random_features(40, 16)
    assert projection.shape == (40, 16)
    for block in (projection[:16], projection[16:32]):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-4, rtol=0)  # orthogonal rows
    norms = orthogonal_random_features(4096, 16).norm(dim=1)
    assert abs(float((norms**2).mean()) - 16) < 1.0  # E|w|^2 = d, as for N(0, I_d) rows
    kernel = favor_kernel(24)
    assert (kernel._phi(torch.randn(3, 16), False) > 0).all() and (kernel._phi(torch.randn(3, 16), True) > 0).all()


@pytest.mark.no_fast_path
def test_favor_features_are_redrawn_on_schedule_in_training_and_saved_in_checkpoints() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 2, variant="linear", feature_map="favor", num_features=8, redraw_interval=2)
    x = torch.randn(1, 6, 32)
    first = module.kernel.projection.clone()
    module.train()
    module(x), module(x)
    assert torch.equal(module.kernel.projection, first)  # two forward passes on the same draw
    module(x)
    assert not torch.equal(module.kernel.projection, first)  # the third one draws anew
    module.eval()
    drawn = module.kernel.projection.clone()
    for _ in range(5):
        module(x)
    assert torch.equal(module.kernel.projection, drawn)  # fixed in eval
    state = module.state_dict()
    assert torch.equal(state["kernel.projection"], drawn)
    torch.manual_seed(1)
    restored = MultiHeadAttention(32, 2, variant="linear", feature_map="favor", num_features=8).eval()
    assert not torch.equal(restored.kernel.projection, drawn)
    restored.load_state_dict(state)
    torch.testing.assert_close(restored(x), module(x))
    never = MultiHeadAttention(32, 2, variant="linear", feature_map="favor", redraw_interval=None).train()
    drawn = never.kernel.projection.clone()
    for _ in range(3):
        never(x)
    assert torch.equal(never.kernel.projection, drawn)
    assert drawn.shape == (int(16 * math.log(16)), 16)  # Performer's default: head_dim * ln(head_dim) features


def test_feature_maps_give_different_attention() -> None:
    outputs = []
    for feature_map in ("elu", "relu", "favor"):
        torch.manual_seed(0)
        module = MultiHeadAttention(32, 2, variant="linear", causal=True, feature_map=feature_map).eval()
        outputs.append(module(torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(1))))
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)
    assert not torch.allclose(outputs[0], outputs[2], atol=1e-3)
