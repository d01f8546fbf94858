"""Linear attention (Katharopoulos et al. 2020) equals its quadratic formula; chunked == recurrent."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo.attention import LinearAttention, MultiHeadAttention
from zoo.attention.fast import linear as fast_linear
from zoo.attention.feature_maps import elu_feature_map
from zoo.attention.linear import DEFAULT_CHUNK_SIZE, causal_linear_attention, exclusive_prefix_sum

from .helpers import random_padding, reference_linear_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("length", "chunk"), [(37, 8), (64, 16), (5, 64), (33, 1)])
def test_linear_attention_matches_quadratic_reference(causal: bool, padded: bool, length: int, chunk: int) -> None:
    generator = torch.Generator().manual_seed(length + chunk)
    q, k, v = (torch.randn(2, 3, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, generator) if padded else None
    kernel = LinearAttention(chunk_size=chunk)
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    expected = reference_linear_attention(q, k, v, causal, padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # need_weights: the explicit normalised weights give the same output and sum to one over real keys.
    out_w, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, need_weights=True)
    torch.testing.assert_close(out_w, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, length), atol=1e-5, rtol=1e-5)
    if padding is not None:
        assert weights.masked_select(padding[:, None, None, :]).abs().max() == 0


def test_chunked_causal_linear_attention_equals_recurrence_step_by_step() -> None:
    torch.manual_seed(0)
    phi_q, phi_k = elu_feature_map(torch.randn(2, 2, 30, 8)), elu_feature_map(torch.randn(2, 2, 30, 8))
    values = torch.randn(2, 2, 30, 5)
    chunked, final = causal_linear_attention(phi_q, phi_k, values, chunk_size=7)
    state = torch.zeros(2, 2, 8, 5)  # S_i = S_{i-1} + phi(k_i) v_i^T (eq. 18)
    steps = []
    for i in range(30):
        state = state + phi_k[:, :, i, :, None] * values[:, :, i, None, :]
        steps.append(torch.einsum("bhd,bhde->bhe", phi_q[:, :, i], state))
    torch.testing.assert_close(chunked, torch.stack(steps, dim=2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, state, atol=1e-5, rtol=1e-5)


def test_linear_cross_attention_matches_reference() -> None:
    torch.manual_seed(1)
    module = MultiHeadAttention(16, 2, variant="linear")
    x, context = torch.randn(2, 5, 16), torch.randn(2, 9, 16)
    padding = random_padding(2, 9, torch.Generator().manual_seed(0))
    w_q, w_k, w_v = module.in_proj.weight.chunk(3)
    b_q, b_k, b_v = module.in_proj.bias.chunk(3)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(2, -1, 2, 8).transpose(1, 2)

    q, k, v = heads(x @ w_q.T + b_q), heads(context @ w_k.T + b_k), heads(context @ w_v.T + b_v)
    attended = reference_linear_attention(q, k, v, causal=False, key_padding_mask=padding)
    expected = module.out_proj(attended.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(module(x, context, key_padding_mask=padding), expected, atol=1e-5, rtol=1e-5)
    cache = module.new_cache(cross_attention=True)
    steps = [module(x[:, i : i + 1], context, key_padding_mask=padding, cache=cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_linear_attention_is_not_quadratic_in_memory() -> None:
    from .test_local_attention import LargestTensor

    length = 2048
    q, k, v = (torch.randn(1, 1, length, 8, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        with LargestTensor() as spy:
            out, _ = LinearAttention()(q, k, v, causal=causal)
            out.sum().backward()
        assert spy.largest <= length * (DEFAULT_CHUNK_SIZE + 1), spy.largest  # (C, C) per chunk, never n x n


def test_linear_module_trains_a_step() -> None:
    torch.manual_seed(2)
    module = nn.Sequential(MultiHeadAttention(16, 2, variant="linear", causal=True))
    x = torch.randn(2, 20, 16)
    module(x).pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())


@pytest.mark.parametrize("causal", [False, True])
def test_a_row_without_attention_mass_is_zero_with_a_finite_gradient(causal: bool) -> None:
    """ReLU features of a query whose projections are all negative are all zero: phi(q) . z = 0. The row is zero
    (the numerator is zero too) and the backward stays finite (integrated gradients start from such rows)."""
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2, variant="linear", causal=causal, feature_map="relu")
    with torch.no_grad():
        module.in_proj.weight.zero_()
        module.in_proj.bias.copy_(torch.cat([-torch.ones(8), torch.ones(8), 10 * torch.randn(8)]))  # q < 0, k, v
    x = torch.randn(2, 5, 8, requires_grad=True)
    out = module(x)
    torch.testing.assert_close(out, module.out_proj.bias.expand_as(out))  # zero rows, then the output bias
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in module.parameters())


def test_feature_map_is_elu_plus_one_with_its_gradient() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64).requires_grad_()
    y = elu_feature_map(x)
    torch.testing.assert_close(y, nn.functional.elu(x) + 1)
    assert torch.autograd.gradcheck(elu_feature_map, (x[::50].detach().clone().requires_grad_(),))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, torch.where(x > 0, 1.0, x.exp()).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feature_map_keeps_the_precision_of_each_dtype(dtype: torch.dtype) -> None:
    # fp32 takes exp through exp2 on the CPU: still within 2e-6 (16 ulp) of elu + 1 computed in float64.
    x = torch.linspace(-16, 6, 100_001).to(dtype)
    expected = (nn.functional.elu(x.double()) + 1).to(dtype)
    tolerance = {"rtol": 2e-6, "atol": 0.0} if dtype == torch.float32 else {}
    torch.testing.assert_close(elu_feature_map(x), expected, **tolerance)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
# Head dim 32: states of 32 x 32 = 1024 numbers, wide enough for the CPU's prefix-sum loop.
@pytest.mark.parametrize(
    ("length", "chunk", "segment", "head_dim"), [(100, 8, 32, 8), (97, 16, 20, 8), (130, 4, 64, 32)]
)
@pytest.mark.fast_path
def test_causal_segments_carry_the_state_exactly(
    feature_map: str, length: int, chunk: int, segment: int, head_dim: int, monkeypatch
) -> None:
    """A long causal sequence runs SEGMENT_LENGTH tokens at a time (rounded to whole chunks), each segment
    continuing the last one's state: outputs and gradients equal the one-pass kernel, with padding and a
    feature map that treats queries and keys differently."""
    from zoo.attention import linear as linear_module
    from zoo.attention.contract import HeadLayout

    generator = torch.Generator().manual_seed(length + segment)
    q, k, v = (torch.randn(2, 2, length, head_dim, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, generator)
    kernel = LinearAttention(chunk_size=chunk, feature_map=feature_map)
    kernel.setup_heads(HeadLayout(num_heads=2, kv_heads=2, head_dim=head_dim))
    kernel.eval()
    expected, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)  # one segment: SEGMENT_LENGTH > length
    monkeypatch.setattr(fast_linear, "SEGMENT_LENGTH", segment)
    calls = []
    original = linear_module.causal_linear_attention
    monkeypatch.setattr(
        linear_module, "causal_linear_attention", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    )
    out, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)
    assert len(calls) == -(-length // max(chunk, segment // chunk * chunk)) > 1
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # Without autograd the segments are written straight into one output (a partial last chunk copied in):
    # the same numbers, bit for bit, as the joined segments.
    with torch.no_grad():
        inference, _ = kernel(q, k, v, causal=True, key_padding_mask=padding)
    assert inference.is_contiguous() and torch.equal(inference, out.detach())


@pytest.mark.parametrize("width", [64, 1024])  # the cumsum path, and the CPU's loop for wide rows
@pytest.mark.parametrize("with_initial", [False, True])
def test_exclusive_prefix_sum_starts_from_initial_in_value_and_gradient(width: int, with_initial: bool) -> None:
    generator = torch.Generator().manual_seed(width)
    x = torch.randn(3, 6, width, dtype=torch.float64, generator=generator, requires_grad=True)
    initial = torch.randn(3, width, dtype=torch.float64, generator=generator, requires_grad=True)
    start = initial if with_initial else torch.zeros_like(initial)
    expected = torch.stack([start + x[:, :index].sum(dim=1) for index in range(6)], dim=1)
    got = exclusive_prefix_sum(x, initial if with_initial else None)
    torch.testing.assert_close(got, expected)
    grad = torch.randn(got.shape, dtype=torch.float64, generator=generator)
    inputs = (x, initial) if with_initial else (x,)
    for have, want in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(have, want)


@pytest.mark.fast_path
def test_long_inference_reuses_one_workspace_across_segments(monkeypatch) -> None:
    """Without autograd the segments of a long sequence share their scratch tensors (each fresh large tensor costs
    page faults on the CPU): one buffer per role for all four segments, and the same numbers as with autograd."""
    from zoo.attention.contract import HeadLayout

    monkeypatch.setattr(fast_linear, "SEGMENT_LENGTH", 32)
    seen: dict[str, set[int]] = {}
    original = fast_linear.scratch

    def spy(workspace, name, shape, like):
        buffer = original(workspace, name, shape, like)
        if buffer is not None:
            seen.setdefault(name, set()).add(buffer.data_ptr())
        return buffer

    monkeypatch.setattr(fast_linear, "scratch", spy)
    kernel = LinearAttention(chunk_size=8)
    kernel.setup_heads(HeadLayout(num_heads=2, kv_heads=2, head_dim=32))
    q, k, v = (torch.randn(1, 2, 128, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))
    expected, _ = kernel(q, k, v, causal=True)  # autograd on: no workspace
    assert not seen
    with torch.no_grad():
        out, _ = kernel(q, k, v, causal=True)
    roles = {"phi_q", "phi_k", "negative", "states", "exclusive", "scores", "numerator", "product"}
    assert set(seen) == roles and all(len(pointers) == 1 for pointers in seen.values()), seen
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="only without autograd"):
        causal_linear_attention(q, k, v, 8, workspace={})
    with pytest.raises(ValueError, match="only without autograd"):
        elu_feature_map(q.requires_grad_(), out=torch.empty_like(q))


def test_causal_kernel_writes_into_out_only_where_it_can() -> None:
    phi_q, phi_k = elu_feature_map(torch.randn(1, 2, 16, 4)), elu_feature_map(torch.randn(1, 2, 16, 4))
    values, target = torch.randn(1, 2, 16, 3), torch.zeros(1, 2, 20, 3)
    with torch.no_grad():
        expected, _ = causal_linear_attention(phi_q, phi_k, values, 4, normalise=True)
        written, _ = causal_linear_attention(phi_q, phi_k, values, 4, normalise=True, out=target[:, :, 2:18])
        assert written.data_ptr() == target[:, :, 2:18].data_ptr() and torch.equal(written, expected)
        assert target[:, :, :2].abs().sum() == 0 and target[:, :, 18:].abs().sum() == 0
        with pytest.raises(ValueError, match="whole chunks"):
            short = (x[:, :, :15] for x in (phi_q, phi_k, values))
            causal_linear_attention(*short, 4, normalise=True, out=target)
    with pytest.raises(ValueError, match="only without autograd"):
        causal_linear_attention(phi_q, phi_k, values, 4, normalise=True, out=target[:, :, :16])
