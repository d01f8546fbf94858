"""Memory-compressed (Linformer) attention: the formula softmax(q (E K)^T / sqrt(d)) (F V) with its shapes and
limits; with identity projections and compressed_length >= length it is exactly full attention.

It is an approximation otherwise. Its error against full softmax attention (relative Frobenius norm of the
outputs; B=2, H=4, n=256, head dim 32, seed 0; `test_error_against_full_attention_is_as_reported` computes
the pooling column):

    inputs                       k=16    k=64    k=128   k=256
    iid N(0, 1), mean pooling    0.795   0.740   0.638   0.000
    smooth, mean pooling         0.062   0.010   0.004   0.000
    iid, untrained (the init)    3.36    1.91    1.40    1.14
    smooth, untrained            1.05    1.05    0.96    1.04

"smooth": random walks along the sequence, standardised (neighbouring tokens alike, as in images or text);
"mean pooling": E = F average consecutive segments of n / k tokens. Without structure to exploit (iid) even
k = n / 2 loses most of the output; the projections are learned with the model (untrained ones are noise).
"""

from __future__ import annotations

import re

import pytest
import torch

from zoo.attention import HeadLayout, MultiHeadAttention, TokenLayout
from zoo.attention.compressed import CompressedAttention
from zoo.attention.functional import softmax_attention
from zoo.attention.registry import causal_variants

from .helpers import random_padding, reference_softmax_attention


def compressed_kernel(max_length: int, heads: int = 2, **options) -> CompressedAttention:
    kernel = CompressedAttention(**options)
    kernel.setup(TokenLayout(max_length=max_length))
    kernel.setup_heads(HeadLayout(num_heads=heads, kv_heads=heads, head_dim=8))
    return kernel


def set_identity(kernel: CompressedAttention) -> None:
    rows, length = kernel.key_projection.shape[-2:]
    with torch.no_grad():
        for projection in (kernel.key_projection, kernel.value_projection):
            projection.copy_(torch.eye(rows, length).expand_as(projection))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("length", "compressed_length"), [(20, 20), (13, 20), (20, 32)])
def test_identity_projections_equal_full_attention(length: int, compressed_length: int, padded: bool, share: bool):
    kernel = compressed_kernel(20, compressed_length=compressed_length, share_projection=share)
    set_identity(kernel)
    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, generator) if padded else None
    out, _ = kernel(q, k, v, key_padding_mask=padding)
    expected = reference_softmax_attention(q, k, v, None if padding is None else ~padding[:, None, None, :])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share", [True, False])
def test_compressed_attention_is_the_linformer_formula(share: bool) -> None:
    kernel = compressed_kernel(24, heads=3, compressed_length=5, share_projection=share)
    assert kernel.key_projection.shape == ((5, 24) if share else (3, 5, 24))
    assert kernel.value_projection.shape == kernel.key_projection.shape
    q, k, v = (torch.randn(2, 3, 17, 8) for _ in range(3))  # shorter than max_length: E[:, :17]
    out, _ = kernel(q, k, v)
    e = kernel.key_projection[..., :17].expand(3, 5, 17)
    f = kernel.value_projection[..., :17].expand(3, 5, 17)
    expected, _ = softmax_attention(q, e @ k, f @ v)  # (H, k, n) @ (B, H, n, D) -> (B, H, k, D)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out.shape == (2, 3, 17, 8)


def test_share_projection_false_gives_each_head_its_own() -> None:
    torch.manual_seed(0)
    shared = compressed_kernel(16, heads=2, compressed_length=4)
    per_head = compressed_kernel(16, heads=2, compressed_length=4, share_projection=False)
    with torch.no_grad():
        per_head.key_projection.copy_(shared.key_projection.expand(2, 4, 16))
        per_head.value_projection.copy_(shared.value_projection.expand(2, 4, 16))
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    torch.testing.assert_close(per_head(q, k, v)[0], shared(q, k, v)[0], atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        per_head.key_projection[1].normal_()
    changed = per_head(q, k, v)[0]
    torch.testing.assert_close(changed[:, 0], shared(q, k, v)[0][:, 0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(changed[:, 1], shared(q, k, v)[0][:, 1], atol=1e-3)


def test_default_compressed_length_is_a_quarter_of_the_max_length() -> None:
    assert compressed_kernel(64).rows == 16
    assert compressed_kernel(17).rows == 5
    assert compressed_kernel(64, compressed_length=7).key_projection.shape == (7, 64)


def test_padded_keys_change_nothing_and_weights_give_the_output() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="compressed", compressed_length=6, layout=TokenLayout(max_length=12))
    x = torch.randn(2, 10, 16)
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 7:] = True
    other = x.clone()
    other[1, 7:] = torch.randn(3, 16)
    out, changed = module(x, key_padding_mask=padding), module(other, key_padding_mask=padding)
    torch.testing.assert_close(changed[0], out[0], atol=1e-6, rtol=1e-6)  # (the padded queries themselves differ)
    torch.testing.assert_close(changed[1, :7], out[1, :7], atol=1e-6, rtol=1e-6)
    # need_weights: the effective weights of the values, zero on padding: out = weights @ v (before out_proj).
    q, k, v = module._heads_qkv(x)
    heads, weights = module.kernel(q, k, v, key_padding_mask=padding, need_weights=True)
    assert weights.shape == (2, 2, 10, 10) and weights[1, :, :, 7:].abs().max() == 0
    torch.testing.assert_close(heads, weights @ v.masked_fill(padding[:, None, :, None], 0.0), atol=1e-5, rtol=1e-5)


def test_compressed_limits_are_one_line_errors() -> None:
    module = MultiHeadAttention(16, 2, variant="compressed", layout=TokenLayout(max_length=12))
    with pytest.raises(ValueError, match=r"at most the model's max_length=12 keys, got 13; valid: 1..12"):
        module(torch.randn(1, 13, 16))
    with pytest.raises(ValueError, match=rf"bidirectional only.*valid choices: {re.escape(str(causal_variants()))}"):
        MultiHeadAttention(16, 2, variant="compressed", causal=True, layout=TokenLayout(max_length=12))
    with pytest.raises(ValueError, match="needs the model's maximum length"):
        MultiHeadAttention(16, 2, variant="compressed")
    with pytest.raises(ValueError, match=r"cross-attention is not supported by variant 'compressed'"):
        module(torch.randn(1, 3, 16), torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="no decoding cache"):
        module.new_cache()
    for options in ({"compressed_length": 0}, {"share_projection": "yes"}):
        with pytest.raises(ValueError, match=next(iter(options))):
            CompressedAttention(**options)


def mean_pooling(rows: int, length: int) -> torch.Tensor:
    pool = torch.zeros(rows, length)
    for row in range(rows):
        pool[row, row * length // rows : (row + 1) * length // rows] = rows / length
    return pool


@pytest.mark.parametrize(
    ("kind", "errors"), [("iid", [0.795, 0.740, 0.638, 0.0]), ("smooth", [0.062, 0.010, 0.004, 0.0])]
)
def test_error_against_full_attention_is_as_reported(kind: str, errors: list[float]) -> None:
    length, heads = 256, 4
    q, k, v = torch.randn(3, 2, heads, length, 32, generator=torch.Generator().manual_seed(0)).unbind(0)
    if kind == "smooth":
        q, k, v = (x.cumsum(2) for x in (q, k, v))
        q, k, v = ((x - x.mean(2, keepdim=True)) / x.std(2, keepdim=True) for x in (q, k, v))
    full, _ = softmax_attention(q, k, v)
    for rows, reported in zip([16, 64, 128, 256], errors):
        kernel = compressed_kernel(length, heads, compressed_length=rows)
        with torch.no_grad():
            kernel.key_projection.copy_(mean_pooling(rows, length))
            kernel.value_projection.copy_(mean_pooling(rows, length))
            error = float((kernel(q, k, v)[0] - full).norm() / full.norm())
        assert error == pytest.approx(reported, abs=0.005), (rows, error)
