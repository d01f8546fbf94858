"""Sliding-window attention is exactly full attention under the banded mask, computed blockwise."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import LocalAttention, MultiHeadAttention, sliding_window_attention
from zoo.attention import sliding_window as window_module
from zoo.attention.biases import ALiBi
from zoo.attention.blockwise import DENSE_MAX_LENGTH
from zoo.attention.fast import band as fast_band

from .helpers import LargestTensor, banded_mask, random_padding, reference_softmax_attention

CASES = [  # (batch, length, window, block): n a multiple of the block or not, window > n, tiny windows
    (2, 50, 8, 16),
    (2, 64, 17, 32),
    (1, 37, 64, 32),
    (3, 45, 1, 8),
    (2, 23, 4, 32),
    (2, 70, 5, 64),
    (2, 100, 32, 16),  # windows of whole blocks (causal 2 blocks left, bidirectional 1 each side)
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("batch", "length", "window", "block"), CASES)
def test_local_attention_matches_masked_full_attention(
    causal: bool, padded: bool, batch: int, length: int, window: int, block: int
) -> None:
    generator = torch.Generator().manual_seed(length * window)
    q, k, v = (torch.randn(batch, 2, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(batch, length, generator, left=True) if padded else None
    allowed = banded_mask(length, window, causal)[None, None]
    if padding is not None:
        allowed = allowed & ~padding[:, None, None, :]

    out, _ = sliding_window_attention(q, k, v, window, causal=causal, key_padding_mask=padding, block_size=block)
    expected = reference_softmax_attention(q, k, v, allowed)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    grad = torch.randn(out.shape, generator=generator)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_window_module_weights_are_the_banded_probabilities() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="local", window=3, causal=True)
    x = torch.randn(1, 10, 16)
    out, weights = module(x, need_weights=True)
    assert torch.equal(weights[0, 0] > 0, banded_mask(10, 3, causal=True))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 10))
    torch.testing.assert_close(module(x), out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_local_attention_never_materialises_n_by_n(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    length, window = 2048, 64
    calls = []
    blockwise = window_module._blockwise_sliding_window
    monkeypatch.setattr(
        window_module, "_blockwise_sliding_window", lambda *args: calls.append(args[0].shape) or blockwise(*args)
    )
    q, k, v = (torch.randn(1, 1, length, 8, requires_grad=True) for _ in range(3))
    padding = torch.zeros(1, length, dtype=torch.bool)
    padding[0, :5] = True
    with LargestTensor() as spy:
        out, _ = sliding_window_attention(q, k, v, window, causal=causal, key_padding_mask=padding)
        out.sum().backward()
    assert calls, "the blockwise kernel was not used"
    # Blocks of C queries x (C + w) keys: O(n * (C + w)) elements, far from the n^2 = 4.2M of full attention.
    assert spy.largest <= length * (window_module.DEFAULT_BLOCK_SIZE + window + 1), spy.largest
    # The spy does see an n x n score matrix when one is made.
    with LargestTensor() as spy:
        reference_softmax_attention(q, k, v)
    assert spy.largest >= length * length


def test_local_attention_longer_than_window_uses_blocks_and_matches_reference() -> None:
    torch.manual_seed(1)
    module = MultiHeadAttention(16, 2, variant="local", window=16, causal=True, chunk_size=8)
    x = torch.randn(2, DENSE_MAX_LENGTH + 44, 16)  # past the dense path of short sequences
    out, weights = module(x, need_weights=True)  # explicit dense path
    torch.testing.assert_close(module(x), out, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 2, DENSE_MAX_LENGTH + 44, DENSE_MAX_LENGTH + 44)


@pytest.mark.parametrize("causal", [True, False])
def test_short_sequences_take_one_dense_call_and_longer_ones_the_blocks(causal: bool, monkeypatch) -> None:
    """Up to DENSE_MAX_LENGTH keys the kernel runs one fused call under the band mask (a 17-token ViT ran 4x
    slower in blocks); past it the blockwise kernel. Both give the masked formula's numbers and gradients."""
    ran = []
    blocks = window_module._blockwise_sliding_window
    monkeypatch.setattr(window_module, "_blockwise_sliding_window", lambda *a: ran.append(a[0].shape[2]) or blocks(*a))
    kernel = LocalAttention(window=8)
    generator = torch.Generator().manual_seed(0)
    for length in (17, DENSE_MAX_LENGTH, DENSE_MAX_LENGTH + 1):
        q, k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=True) for _ in range(3))
        out, _ = kernel(q, k, v, causal=causal)
        expected = reference_softmax_attention(q, k, v, banded_mask(length, 8, causal)[None, None])
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v))):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert ran == [DENSE_MAX_LENGTH + 1]


@pytest.mark.fast_path
@pytest.mark.parametrize(("chunk_size", "blocks"), [(None, (32, 64)), (8, (8, 8))])
def test_chunk_size_sets_the_blocks_of_the_chunked_path(chunk_size, blocks, monkeypatch) -> None:
    """attention.chunk_size is the query block of the forward and the backward; null leaves the measured
    defaults (FORWARD_BLOCK_SIZE forward, DEFAULT_BLOCK_SIZE backward)."""
    seen = []
    apply = fast_band._ChunkedBand.apply
    monkeypatch.setattr(fast_band._ChunkedBand, "apply", lambda *args: seen.append(args[-1]) or apply(*args))
    module = MultiHeadAttention(16, 2, variant="local", window=64, causal=True, chunk_size=chunk_size)
    module(torch.randn(1, 300, 16)).sum().backward()
    assert seen == [blocks]


CHUNKED_CASES = [  # (batch, length, window, block, kv heads, causal): chunks of 32 queries, windows of whole
    # blocks or not, the last block and chunk partial, grouped key/value heads
    (2, 150, 16, 8, 2, True),
    (1, 200, 40, 16, 1, True),
    (2, 131, 16, 8, 2, False),
    (1, 97, 33, 16, 2, False),
    (2, 300, 100, 16, 2, True),  # windows reaching back over several chunks
]


@pytest.mark.parametrize("one_block", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize(("batch", "length", "window", "block", "kv_heads", "causal"), CHUNKED_CASES)
def test_chunked_band_matches_masked_attention_across_chunks(
    one_block: bool,
    alibi: bool,
    batch: int,
    length: int,
    window: int,
    block: int,
    kv_heads: int,
    causal: bool,
    monkeypatch,
    fast_kernels: bool,
) -> None:
    """The CPU fast path without padding or dropout (`_ChunkedBand`: a chunk of query blocks per fused call, the key
    windows rebuilt in the backward; chunks of 32 queries, or of one block as the default backward's) equals the
    formula, outputs and gradients, with a bias and grouped heads; so does the reference path, with the switch
    off (and then `_ChunkedBand` does not run)."""
    monkeypatch.setattr(fast_band, "CHUNK_QUERIES", block if one_block else 32)
    calls = []
    apply = fast_band._ChunkedBand.apply
    monkeypatch.setattr(fast_band._ChunkedBand, "apply", lambda *args: calls.append(1) or apply(*args))
    generator = torch.Generator().manual_seed(length + window)
    q = torch.randn(batch, 4, length, 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, length, 8, generator=generator, requires_grad=True) for _ in range(2))
    bias, dense_bias = None, None
    if alibi:
        bias = ALiBi(4)
        positions = torch.arange(length)
        dense_bias = bias(positions, positions)
    out, _ = sliding_window_attention(q, k, v, window, causal=causal, block_size=block, bias=bias)
    expected = reference_softmax_attention(q, k, v, banded_mask(length, window, causal)[None, None], dense_bias)
    assert bool(calls) == fast_kernels, "the chunked path runs exactly when the switch is on"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("length", "window", "causal"), [(131, 16, True), (97, 33, False), (300, 100, True)])
def test_chunked_band_forward_and_backward_may_block_the_queries_differently(
    length: int, window: int, causal: bool, monkeypatch, fast_kernels: bool
) -> None:
    """With block_size=None the forward blocks the queries by FORWARD_BLOCK_SIZE and the backward by
    DEFAULT_BLOCK_SIZE (given each query's log-sum-exp; the backward's padded query slots get +inf): outputs and
    gradients still equal the formula, the lengths not multiples of either block."""
    monkeypatch.setattr(fast_band, "FORWARD_BLOCK_SIZE", 8)
    monkeypatch.setattr(window_module, "DEFAULT_BLOCK_SIZE", 16)
    monkeypatch.setattr(fast_band, "FORWARD_CHUNK_QUERIES", 40)  # 5 forward blocks per chunk
    monkeypatch.setattr(fast_band, "CHUNK_QUERIES", 32)
    blocks = []
    apply = fast_band._ChunkedBand.apply
    monkeypatch.setattr(fast_band._ChunkedBand, "apply", lambda *args: blocks.append(args[-1]) or apply(*args))
    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    out, _ = sliding_window_attention(q, k, v, window, causal=causal)
    expected = reference_softmax_attention(q, k, v, banded_mask(length, window, causal)[None, None])
    assert blocks == ([(8, 16)] if fast_kernels else [])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.fast_path
def test_chunked_band_holds_no_tensor_of_every_window() -> None:
    """Forward and backward hold nothing larger than one (n, D) input or one chunk's mask: the blocks' key
    windows ((n / block) x (block + window) keys, twice the keys here) and their masks exist a chunk at a time,
    in the forward and the backward (whole-sequence ones would be 2x and 4x the bound)."""
    length, window, dim = 4096, 64, 8
    q, k, v = (torch.randn(1, 1, length, dim, requires_grad=True) for _ in range(3))
    with LargestTensor() as spy:
        out, _ = sliding_window_attention(q, k, v, window, causal=True)
        out.sum().backward()
    chunk_mask = fast_band.CHUNK_QUERIES * (window_module.DEFAULT_BLOCK_SIZE + window)
    assert spy.largest <= max(length * dim, chunk_mask), spy.largest


def test_a_window_that_covers_the_models_sequences_is_named_as_full_attention() -> None:
    """conf/attention/local.yaml's 256 covers a digit ViT's 17 tokens: `model=vit attention=local` was full attention
    without a word (the variant study's first local rows). The kernel says so, and only when it is exactly so."""
    from zoo.attention import AttentionConfig, kernel_notices
    from zoo.models.vit import ViT, ViTConfig

    def vit(window: int) -> ViT:
        return ViT(ViTConfig(image_size=8, patch_size=2, depth=2, attention=AttentionConfig("local", window=window)))

    notices = kernel_notices(vit(256))  # 16 patches + a class token; one line for both blocks
    assert notices == [
        "attention.window=256 covers all 17 tokens of this model's sequences: local attention is exactly full "
        "attention here; set attention.window below 17 for a sliding window"
    ]
    assert kernel_notices(vit(32)) and not kernel_notices(vit(31)) and not kernel_notices(vit(8))
    assert not kernel_notices(ViT(ViTConfig(image_size=8, patch_size=2, depth=1)))  # full attention: nothing to say
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 17, 8, generator=generator) for _ in range(3))
    full = {causal: reference_softmax_attention(q, k, v, banded_mask(17, 10**6, causal)) for causal in (True, False)}
    for causal in (True, False):  # the noticed window (32) is full attention both ways; 31 is not bidirectionally
        assert torch.allclose(sliding_window_attention(q, k, v, 32, causal=causal)[0], full[causal], atol=1e-6)
    assert not torch.allclose(sliding_window_attention(q, k, v, 31, causal=False)[0], full[False], atol=1e-3)
