"""Full attention with ALiBi or T5 on the CPU's fused kernel (zoo/attention/fast/bias.py) equals the dense formula:
outputs and the gradients of q, k, v and T5's table, in fp64, across query-block edges, causal or not, with key
padding and grouped key/value heads; and its memory holds no (H, n, n) mask, let alone one per batch element."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention
from zoo.attention import flex as flex_module
from zoo.attention.biases import build_position_bias
from zoo.attention.fast import bias as fast_bias

from .helpers import LargestTensor, random_padding, reference_softmax_attention


def biased_reference(q, k, v, bias, causal, padding):
    """The textbook formula with the bias as a dense (H, n, n) mask."""
    length = q.shape[2]
    allowed = torch.ones(length, length, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    if padding is not None:
        allowed = allowed & ~padding[:, None, None, :]
    positions = torch.arange(length, device=q.device)
    return reference_softmax_attention(q, k, v, allowed, bias(positions, positions).to(q.dtype))


def t5_with_order_one_values(heads: int, causal: bool, num_buckets: int = 8, max_distance: int = 20):
    bias = build_position_bias("t5", heads, causal=causal, num_buckets=num_buckets, max_distance=max_distance)
    with torch.no_grad():
        bias.relative_attention_bias.weight.normal_(generator=torch.Generator().manual_seed(2))
    return bias.double()


@pytest.mark.fast_path
@pytest.mark.parametrize(
    ("name", "split"), [("alibi", False), ("t5", False), ("t5", True)], ids=["alibi", "t5-blocks", "t5-band-and-ends"]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("length", "kv_heads"), [(157, 4), (70, 2), (64, 1)])
def test_blockwise_bias_attention_equals_the_dense_formula_in_fp64(
    monkeypatch, name, split, causal, padded, length, kv_heads
):
    """Blocks of 64 query rows (the least), lengths that are and are not a multiple of it; T5's last buckets begin
    within reach of a block (max_distance 20), so both the band and the column sums carry its gradient. T5 also
    through the band-and-ends split (ALiBi differs at every distance: it has no ends), with band blocks of 16 rows
    (edges inside the band, a last block cut short)."""
    monkeypatch.setattr(fast_bias, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(fast_bias, "SPLIT_FROM", dict.fromkeys((True, False), 1 if split else 10**9))
    monkeypatch.setattr(fast_bias, "BAND_BLOCK", 16)
    generator = torch.Generator().manual_seed(length)
    heads = 4
    q = torch.randn(3, heads, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(3, kv_heads, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    bias = t5_with_order_one_values(heads, causal) if name == "t5" else build_position_bias(name, heads, causal=causal)
    padding = random_padding(3, length, generator) if padded else None
    if padded:
        padding[2] = True  # a row of padding only: its queries see no key and give zeros
    out = fast_bias.relative_bias_attention(q, k, v, bias, causal=causal, key_padding_mask=padding)
    expected = biased_reference(q, k, v, bias, causal, padding)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    inputs = (q, k, v, *bias.parameters())
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-10)


@pytest.mark.fast_path
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20), (4, 3)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_is_one_value_beyond_its_reach(num_buckets, max_distance, bidirectional) -> None:
    """constant_beyond gives the distance M from which T5's bucket no longer changes on either side: the table over
    distances -M ... M then is the bias at every distance."""
    bias = build_position_bias("t5", 2, causal=not bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    length = 3 * max_distance + 7
    reach = fast_bias.constant_beyond(bias, length)
    table = fast_bias.distance_table(bias, reach, torch.device("cpu"))
    positions = torch.arange(length)
    dense = bias(positions, positions)  # (H, n, n)
    distance = positions[None, :] - positions[:, None]
    torch.testing.assert_close(table[:, distance.clamp(-reach, reach) + reach], dense)


@pytest.mark.fast_path
def test_fp32_far_keys_with_alibi_stay_exact_to_fp32_rounding() -> None:
    """In fp32 the backward drops probabilities below exp(-50) (their denormal products slow the kernel): ALiBi
    over 600 tokens pushes most keys there, and outputs and gradients still equal the fp64 formula's."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 600, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    bias = build_position_bias("alibi", 4, causal=False)
    grad = torch.randn(2, 4, 600, 16, generator=generator, dtype=torch.float64)
    results = []
    for dtype in (torch.float32, torch.float64):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        if dtype == torch.float32:
            out = fast_bias.relative_bias_attention(*inputs, bias)
        else:
            out = biased_reference(*inputs, bias, False, None)
        results.append([out, *torch.autograd.grad(out, inputs, grad.to(dtype))])
    for got, want in zip(*results):
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.fast_path
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_a_bias_costs_no_mask_per_batch_element_nor_per_head_pair_of_positions(monkeypatch, name) -> None:
    """The largest tensor a training step of full attention with a bias allocates is no larger than without one, or
    (T5's table gradient) than the band of one query block's scores, B * H * block * (block + 2 M): never a
    (B, H, n, n) or (H, n, n) mask. ALiBi's bias and T5's forward are views of the values per distance."""
    monkeypatch.setattr(fast_bias, "BLOCK_ELEMENTS", 1)  # blocks of 64 rows
    torch.manual_seed(0)
    length, batch, heads = 300, 4, 4
    x = torch.randn(batch, length, 32)
    padding = torch.arange(length)[None] >= torch.tensor([[300], [250], [100], [20]])
    largest = {}
    for bias in (None, name):
        module = MultiHeadAttention(32, heads, position_bias=bias, num_buckets=8, max_distance=20)
        with LargestTensor() as spy:
            module(x, key_padding_mask=padding).sum().backward()
        largest[bias] = spy.largest
    reach = fast_bias.constant_beyond(module.position_bias, length) if name == "t5" else 0
    band = batch * heads * 64 * (64 + 2 * reach) if name == "t5" else 0
    assert largest[name] <= max(largest[None], band), largest
    assert largest[name] < heads * length * length


@pytest.mark.no_fast_path
@pytest.mark.parametrize("name", ["alibi", "t5"])
@pytest.mark.parametrize("causal", [False, True])
def test_score_mods_add_the_bias_of_each_query_and_key(name, causal) -> None:
    """FlexAttention's score_mod for a bias (zoo/attention/flex.py), called on a grid of scores and indices as
    FlexAttention calls it, adds exactly what the bias module gives at those positions."""
    heads, length = 4, 50
    bias = (
        t5_with_order_one_values(heads, causal).float()
        if name == "t5"
        else build_position_bias(name, heads, causal=causal)
    )
    score_mod = flex_module.position_bias_score_mod(bias, length, torch.device("cpu"))
    scores = torch.randn(2, heads, length, length, generator=torch.Generator().manual_seed(0))
    batch, head, q_idx, kv_idx = torch.meshgrid(
        torch.arange(2), torch.arange(heads), torch.arange(length), torch.arange(length), indexing="ij"
    )
    positions = torch.arange(length)
    expected = scores + bias(positions, positions)
    if causal:  # the causal mask hides what the bias gives after the query
        expected, got = (
            t.masked_fill(kv_idx > q_idx, 0.0) for t in (expected, score_mod(scores, batch, head, q_idx, kv_idx))
        )
    else:
        got = score_mod(scores, batch, head, q_idx, kv_idx)
    torch.testing.assert_close(got, expected)


@pytest.mark.no_fast_path
@pytest.mark.parametrize(("name", "causal"), [("alibi", True), ("t5", False)])
def test_flex_attention_with_a_bias_score_mod_equals_the_formula_on_the_cpu(name, causal) -> None:
    """Eager FlexAttention runs forward on the CPU (its backward is CUDA's): the score_mod and the block mask of
    causality and padding give the formula's outputs."""
    from torch.nn.attention.flex_attention import flex_attention

    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 40, 8, generator=generator) for _ in range(3))
    bias = t5_with_order_one_values(4, causal).float() if name == "t5" else build_position_bias(name, 4, causal=causal)
    padding = torch.zeros(2, 40, dtype=torch.bool)
    padding[1, 30:] = True
    with torch.no_grad():
        out = flex_module.flex_bias_attention(
            q, k, v, bias, causal=causal, key_padding_mask=padding, attend=flex_attention
        )
        expected = biased_reference(q, k, v, bias, causal, padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not flex_module.auto_uses_flex_bias(q, k, bias, 0.0, False)  # auto keeps the CPU path here


@pytest.mark.no_fast_path
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
@pytest.mark.parametrize("name", ["alibi", "t5"])
@pytest.mark.parametrize("causal", [False, True])
def test_full_attention_with_a_bias_on_cuda_takes_flex_and_equals_the_formula(name, causal) -> None:
    """On CUDA `auto` computes the bias inside FlexAttention: outputs and gradients (q, k, v, T5's table) equal the
    dense formula's."""
    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 200, 16, generator=generator).to(device).requires_grad_() for _ in range(3))
    bias = t5_with_order_one_values(4, causal).float() if name == "t5" else build_position_bias(name, 4, causal=causal)
    bias = bias.to(device)
    padding = torch.zeros(2, 200, dtype=torch.bool, device=device)
    padding[1, 150:] = True
    kernel = MultiHeadAttention(64, 4, position_bias=name).kernel
    assert flex_module.auto_uses_flex_bias(q, k, bias, 0.0, False)
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias)
    expected = biased_reference(q, k, v, bias, causal, padding)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    inputs = (q, k, v, *bias.parameters())
    for got, want in zip(torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(expected.sum(), inputs)):
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
