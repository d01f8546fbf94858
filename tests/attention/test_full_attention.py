"""Full attention through the shared module equals torch.nn.MultiheadAttention with copied weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo.attention import MultiHeadAttention

from .helpers import random_padding

DIM, HEADS = 32, 4


def twin_modules(bias: bool = True) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    torch.manual_seed(0)
    ours = MultiHeadAttention(DIM, HEADS, variant="full", bias=bias)
    theirs = nn.MultiheadAttention(DIM, HEADS, bias=bias, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            theirs.in_proj_bias.copy_(ours.in_proj.bias)
            theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, theirs


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_full_attention_matches_torch_multihead_attention(causal: bool, padded: bool) -> None:
    ours, theirs = twin_modules()
    ours.causal = causal
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 11, DIM, generator=generator)
    # Right padding keeps every causal query row with at least one real key (torch gives NaN otherwise).
    padding = random_padding(3, 11, generator) if padded else None
    causal_mask = torch.ones(11, 11, dtype=torch.bool).triu(1) if causal else None  # torch: True = blocked

    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(x_ours, key_padding_mask=padding)
    expected, _ = theirs(x_theirs, x_theirs, x_theirs, key_padding_mask=padding, attn_mask=causal_mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.in_proj.weight.grad, theirs.in_proj_weight.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_need_weights_matches_torch_head_averaged_probabilities(causal: bool) -> None:
    ours, theirs = twin_modules()
    ours.causal = causal
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 9, DIM, generator=generator)
    padding = random_padding(2, 9, generator)
    causal_mask = torch.ones(9, 9, dtype=torch.bool).triu(1) if causal else None
    out, weights = ours(x, key_padding_mask=padding, need_weights=True)
    expected, expected_weights = theirs(
        x, x, x, key_padding_mask=padding, attn_mask=causal_mask, average_attn_weights=True
    )
    assert weights.shape == (2, HEADS, 9, 9)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.mean(dim=1), expected_weights, atol=1e-5, rtol=1e-5)
    # The fused path (no weights) gives the same output as the explicit one.
    torch.testing.assert_close(ours(x, key_padding_mask=padding), out, atol=1e-5, rtol=1e-5)


def test_full_cross_attention_matches_torch_multihead_attention() -> None:
    ours, theirs = twin_modules()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, DIM, generator=generator)
    context = torch.randn(2, 8, DIM, generator=generator)
    padding = random_padding(2, 8, generator)
    out = ours(x, context, key_padding_mask=padding)
    expected, _ = theirs(x, context, context, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # A static cache computes the context's keys once and gives the same answer step after step.
    cache = ours.new_cache(cross_attention=True)
    steps = [ours(x[:, i : i + 1], context, key_padding_mask=padding, cache=cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_fully_padded_query_rows_give_zeros_and_finite_gradients() -> None:
    ours = MultiHeadAttention(DIM, HEADS, causal=True)
    x = torch.randn(2, 6, DIM, requires_grad=True)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, :2] = True  # left padding: row 1's first two queries see no real key
    out, _ = ours.kernel(*(torch.randn(2, HEADS, 6, 8) for _ in range(3)), causal=True, key_padding_mask=padding)
    assert out[1, :, :2].abs().max() == 0 and out[1, :, 2:].abs().max() > 0
    ours(x, key_padding_mask=padding).sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.fast_path
@pytest.mark.parametrize("masked", [False, True], ids=["is_causal", "float-mask"])
def test_low_precision_training_on_cpu_attends_in_fp32(masked: bool) -> None:
    """bf16 q, k, v that need gradients go through fp32 SDPA (the CPU's bf16 backward is several times slower):
    the output and gradients are fp32 SDPA's on the same numbers, returned in bf16; without gradients bf16 stays."""
    from zoo.attention.fast.sdpa import COMPOSITE_MAX_KEYS
    from zoo.attention.functional import sdpa

    n = COMPOSITE_MAX_KEYS + 16  # the fused kernel's path (shorter sequences take the composite)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 8, generator=generator).bfloat16() for _ in range(3))
    options = {"attn_mask": torch.randn(n, n, generator=generator).bfloat16()} if masked else {"is_causal": True}
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = [t.float().requires_grad_() for t in (q, k, v)]
    out = sdpa(*ours, **options)
    fp32_options = {"attn_mask": options["attn_mask"].float()} if masked else options
    expected = torch.nn.functional.scaled_dot_product_attention(*reference, **fp32_options)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected.bfloat16(), atol=0, rtol=0)
    grad = torch.randn(out.shape, generator=generator).bfloat16()
    out.backward(grad)
    expected.backward(grad.float())
    for mine, theirs in zip(ours, reference):
        assert mine.grad.dtype == torch.bfloat16
        torch.testing.assert_close(mine.grad, theirs.grad.bfloat16(), atol=0, rtol=0)
    with torch.no_grad():  # inference keeps the bf16 kernel (its forward is the faster one)
        torch.testing.assert_close(
            sdpa(q, k, v, **options), torch.nn.functional.scaled_dot_product_attention(q, k, v, **options)
        )


def _composite_cases() -> dict[str, tuple[tuple[int, int, int], dict]]:
    """name -> ((query heads, queries, keys), SDPA options), each on a short sequence."""
    generator = torch.Generator().manual_seed(5)
    float_mask = torch.randn(12, 20, generator=generator)
    float_mask[3] = float("-inf")  # a query row with no key: zeros, as the fused kernel gives
    bool_mask = torch.rand(2, 1, 12, 20, generator=generator) > 0.3
    bool_mask[1, 0, 4] = False
    return {
        "no-mask": ((4, 20, 20), {}),
        "is_causal": ((4, 20, 20), {"is_causal": True}),
        "is_causal-fewer-queries": ((4, 12, 20), {"is_causal": True}),  # SDPA's top-left aligned triangle
        "float-mask": ((4, 12, 20), {"attn_mask": float_mask}),
        "bool-mask": ((4, 12, 20), {"attn_mask": bool_mask}),
        "float-mask-of-keys": ((4, 12, 20), {"attn_mask": float_mask[:1, None, None, :]}),  # (1, 1, 1, S)
        "grouped-kv-heads": ((4, 20, 20), {"enable_gqa": True, "is_causal": True}),
        "scale": ((4, 20, 20), {"scale": 0.3}),
    }


@pytest.mark.fast_path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(_composite_cases()))
def test_short_sequences_take_the_composite_and_match_fused_sdpa(case: str, dtype: torch.dtype, monkeypatch) -> None:
    """At most COMPOSITE_MAX_KEYS keys on the CPU: softmax(q k^T * scale + mask) v in plain ops (in fp32 for
    bf16 inputs), the fused kernel's output and gradients to fp32 rounding; the fused kernel is not called."""
    from zoo.attention import functional

    (heads, q_len, k_len), options = _composite_cases()[case]
    kv_heads = 2 if options.get("enable_gqa") else heads
    generator = torch.Generator().manual_seed(7)
    shapes = [(2, heads, q_len, 16), (2, kv_heads, k_len, 16), (2, kv_heads, k_len, 16)]
    inputs = [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]
    ours = [t.clone().requires_grad_() for t in inputs]
    reference = [t.float().requires_grad_() for t in inputs]
    expected = torch.nn.functional.scaled_dot_product_attention(*reference, **options)
    monkeypatch.setattr(functional.F, "scaled_dot_product_attention", lambda *a, **kw: pytest.fail("fused kernel"))
    out = functional.sdpa(*ours, **options)
    assert out.dtype == dtype
    # bf16: one rounding of fp32 results equal to ~1e-6, which may flip the last of bf16's 8 bits
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 8e-3}
    torch.testing.assert_close(out, expected.to(dtype), **tolerance)
    grad = torch.randn(out.shape, generator=generator).to(dtype)
    out.backward(grad)
    expected.backward(grad.float())
    for mine, theirs in zip(ours, reference):
        assert mine.grad.dtype == dtype and torch.isfinite(mine.grad).all()
        torch.testing.assert_close(mine.grad, theirs.grad.to(dtype), **tolerance)


@pytest.mark.fast_path
def test_longer_sequences_attention_dropout_and_inference_keep_the_fused_kernel(monkeypatch) -> None:
    """Inference too: the fused kernel's bf16 forward beats the composite in fp32 (recipes.md)."""
    from zoo.attention import functional
    from zoo.attention.fast import sdpa as fast_sdpa

    calls = []
    fused = functional.F.scaled_dot_product_attention
    monkeypatch.setattr(
        functional.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(kw) or fused(*a, **kw)
    )
    short, long = (torch.randn(1, 2, n, 8) for n in (fast_sdpa.COMPOSITE_MAX_KEYS, fast_sdpa.COMPOSITE_MAX_KEYS + 1))
    short_grad, long_grad = short.clone().requires_grad_(), long.clone().requires_grad_()
    functional.sdpa(short_grad, short_grad, short_grad)
    assert calls == []
    functional.sdpa(long_grad, long_grad, long_grad)
    functional.sdpa(short_grad, short_grad, short_grad, dropout_p=0.5)
    functional.sdpa(short, short, short)
    functional.sdpa(short.bfloat16(), short.bfloat16(), short.bfloat16())
    assert len(calls) == 4 and calls[1]["dropout_p"] == 0.5
