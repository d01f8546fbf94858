"""Position biases: ALiBi as BLOOM's build_alibi_tensor, T5's buckets and bias as transformers' T5Attention,
biased kernels equal the masked O(n^2) formula (outputs and gradients), one bias per stack or per layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.attention import ALiBi, AttentionConfig, MultiHeadAttention, T5RelativeBias, alibi_slopes
from zoo.attention.biases import build_position_bias, relative_position_bucket

from .helpers import banded_mask, random_padding, reference_softmax_attention


@pytest.mark.no_fast_path
@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32])
def test_alibi_slopes_and_bias_equal_bloom(num_heads: int) -> None:
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    length = 11
    bloom = build_alibi_tensor(torch.ones(1, length), num_heads, torch.float32).view(num_heads, length)  # m_h * j
    torch.testing.assert_close(alibi_slopes(num_heads), bloom[:, 1])
    positions = torch.arange(length)
    bias = ALiBi(num_heads)(positions, positions)  # (H, T, T) = -m_h |i - j|
    # BLOOM adds m_h * j to every query row: on the causal part (j <= i) that is ours plus m_h * i, a constant
    # per row, which the softmax does not see.
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    shifted = bias - bias[:, :, :1]
    torch.testing.assert_close(shifted[:, causal], bloom[:, None, :].expand(-1, length, -1)[:, causal])
    scores = torch.randn(num_heads, length, length)
    ours = (scores + bias).masked_fill(~causal, float("-inf")).softmax(-1)
    theirs = (scores + bloom[:, None, :]).masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(bias, bias.transpose(1, 2))  # bidirectional: symmetric in i - j


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20), (4, 3), (64, 1000)])
def test_t5_buckets_equal_transformers(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-1200, 1200).view(3, -1)
    expected = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(relative_position_bucket(relative, bidirectional, num_buckets, max_distance), expected)
    assert int(expected.max()) == num_buckets - 1


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_bias_equals_transformers_compute_bias(is_decoder: bool) -> None:
    pytest.importorskip("transformers")
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
        is_decoder=is_decoder,
    )  # fmt: skip
    theirs = T5Attention(config, has_relative_attention_bias=True)
    ours = T5RelativeBias(4, num_buckets=8, max_distance=20, bidirectional=not is_decoder)
    with torch.no_grad():
        ours.relative_attention_bias.weight.copy_(theirs.relative_attention_bias.weight)
    # Five new queries at positions 25..29 over 30 keys, as in cached decoding.
    expected = theirs.compute_bias(5, 30, past_seen_tokens=25)[0]
    torch.testing.assert_close(ours(torch.arange(25, 30), torch.arange(30)), expected)
    # Batched positions (one row per query block) give each row's bias.
    blocks = ours(torch.arange(10).view(2, 5), torch.arange(12).view(2, 6))
    torch.testing.assert_close(blocks[1], ours(torch.arange(5, 10), torch.arange(6, 12)))


def random_bias(name: str, heads: int, causal: bool) -> torch.nn.Module:
    bias = build_position_bias(name, heads, causal=causal, num_buckets=8, max_distance=20)
    if name == "t5":
        with torch.no_grad():  # values of order one: the bias visibly shapes the attention
            bias.relative_attention_bias.weight.normal_(generator=torch.Generator().manual_seed(5))
    return bias


KERNELS = [("full", None), ("local", 5), ("local", 64)]


@pytest.mark.parametrize("name", ["alibi", "t5"])
@pytest.mark.parametrize(("variant", "window"), KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_biased_attention_equals_masked_formula(name: str, variant: str, window: int | None, causal, padded) -> None:
    generator = torch.Generator().manual_seed(1)
    heads, length = 4, 19
    q, k, v = (torch.randn(2, heads, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, generator) if padded else None
    kernel = AttentionConfig(variant=variant, **({"window": window, "chunk_size": 4} if window else {})).build_kernel()
    bias = random_bias(name, heads, causal)

    allowed = banded_mask(length, window, causal) if window else torch.ones(length, length, dtype=torch.bool)
    if causal and not window:
        allowed = allowed.tril()
    if padding is not None:
        allowed = allowed & ~padding[:, None, None, :]
    positions = torch.arange(length)
    expected = reference_softmax_attention(q, k, v, allowed, bias(positions, positions))
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    inputs = (q, k, v, *bias.parameters())
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    out_w, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias, need_weights=True)
    torch.testing.assert_close(out_w, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights @ v, expected, atol=1e-5, rtol=1e-5)
    assert (weights * ~allowed).abs().max() == 0


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_position_bias_changes_attention(name: str) -> None:
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, causal=True)
    biased = MultiHeadAttention(32, 4, causal=True, position_bias=name)
    biased.load_state_dict(plain.state_dict(), strict=False)
    if name == "t5":
        torch.nn.init.normal_(biased.position_bias.relative_attention_bias.weight)
    x = torch.randn(2, 12, 32)
    assert not torch.allclose(plain(x), biased(x), atol=1e-3)


def tiny_gpt(**attention):
    from zoo.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=16, attention=attention))


def test_t5_bias_is_one_module_per_stack_or_one_per_layer() -> None:
    shared = tiny_gpt(position_bias="t5", num_buckets=16, max_distance=40)
    per_layer = tiny_gpt(position_bias="t5", share_bias=False)
    assert shared.wpe is None  # the bias replaces the position table
    biases = [block.self_attn.position_bias for block in shared.blocks]
    assert all(bias is biases[0] for bias in biases) and biases[0].relative_attention_bias.num_embeddings == 16
    assert (biases[0].max_distance, biases[0].bidirectional) == (40, False)  # GPT is causal: decoder bucketing
    assert len({id(block.self_attn.position_bias) for block in per_layer.blocks}) == 3
    assert per_layer.num_parameters() - shared.num_parameters() == 3 * 32 * 2 - 16 * 2  # (buckets, heads) tables
    # A shared table appears under every layer's name, like tied weights, and loads back as one.
    again = tiny_gpt(position_bias="t5", num_buckets=16, max_distance=40)
    again.load_state_dict(shared.state_dict())
    assert all(block.self_attn.position_bias is again.blocks[0].self_attn.position_bias for block in again.blocks)
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(again.eval()(idx), shared.eval()(idx))


def test_translation_encoder_and_decoder_have_their_own_bucketing() -> None:
    from zoo.models.translation import TranslationConfig, TranslationTransformer

    config = TranslationConfig(
        vocab_size=20, dim=16, encoder_layers=2, decoder_layers=2, num_heads=2, mlp_dim=32, positions="t5"
    )
    model = TranslationTransformer(config)
    encoder, decoder = model.encoder[0].self_attn.position_bias, model.decoder[0].self_attn.position_bias
    assert encoder.bidirectional and not decoder.bidirectional
    assert model.encoder[1].self_attn.position_bias is encoder and model.decoder[1].self_attn.position_bias is decoder
    assert model.decoder[0].cross_attn.position_bias is None  # no relative positions across sequences
    assert model.source_positions is None and model.config.attention.position_bias == "t5"


def pattern_kernel(kind: str, causal: bool):
    """A pattern kernel and its mask (n, n) written with loops (tests/attention/helpers.py)."""
    from zoo.attention import TokenLayout
    from zoo.attention.axial import AxialAttention
    from zoo.attention.sparse import SparseAttention

    from .helpers import axial_mask, sparse_mask

    if kind in ("strided", "fixed"):
        summary = 2 if kind == "fixed" else None
        kernel, allowed = SparseAttention(pattern=kind, stride=6, summary=summary), sparse_mask(45, kind, 6, 2, causal)
        kernel.setup(TokenLayout())
    elif kind == "axial":
        kernel, allowed = AxialAttention(row_length=5), axial_mask(23, 5, 0, causal)
        kernel.setup(TokenLayout())
    else:  # a grid with two prefix tokens, as a ViT with a class and a register token
        kernel, allowed = AxialAttention(), axial_mask(18, 4, 2, causal)
        kernel.setup(TokenLayout(grid=(4, 4), prefix_tokens=2))
    return kernel, allowed


@pytest.mark.parametrize("path", ["fused", "explicit"])
@pytest.mark.parametrize(("causal", "kv_heads"), [(False, 2), (True, 1)], ids=["bidirectional_gqa", "causal_mqa"])
@pytest.mark.parametrize("name", ["alibi", "t5"])
@pytest.mark.parametrize("kind", ["strided", "fixed", "axial", "axial_grid"])
def test_pattern_kernels_with_a_bias_and_grouped_heads_equal_the_masked_formula(
    kind: str, name: str, causal: bool, kv_heads: int, path: str, monkeypatch
) -> None:  # fmt: skip
    """sparse and axial on their blockwise paths (the fused CPU flash kernel, or the formula under autograd,
    which learned biases take in training), with ALiBi or T5 and kv_heads < heads, padded: outputs and the
    gradients of q, k, v (and of T5's table on the explicit path) equal softmax(q k^T / sqrt(d) + bias) v
    under the pattern's mask, with each key/value head repeated for its group. need_weights (the dense path)
    gives the same output and zero weights outside the pattern."""
    from .helpers import use_blockwise_path

    use_blockwise_path(monkeypatch, fused=path == "fused")
    kernel, allowed = pattern_kernel(kind, causal)
    heads, length = 4, allowed.shape[0]
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, heads, length, 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, length, 8, generator=generator, requires_grad=True) for _ in range(2))
    bias = random_bias(name, heads, causal)
    if path == "fused":
        bias.requires_grad_(False)  # the fused kernel has no bias gradient: a learned bias in training is explicit
    padding = random_padding(2, length, generator, left=causal)
    mask = allowed[None, None] & ~padding[:, None, None, :]
    positions = torch.arange(length)
    expected = reference_softmax_attention(q, k, v, mask, bias(positions, positions))
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # torch's own formula agrees (SDPA with the float mask and grouped heads; rows without keys are zeros here).
    additive = bias(positions, positions).masked_fill(~mask, float("-inf"))
    with torch.no_grad():
        by_torch = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, enable_gqa=True)
    torch.testing.assert_close(out.detach(), by_torch.where(mask.any(-1)[..., None], 0.0), atol=1e-5, rtol=1e-5)

    inputs = (q, k, v, *(p for p in bias.parameters() if p.requires_grad))
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    out_w, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias, need_weights=True)
    assert weights.shape == (2, heads, length, length)
    torch.testing.assert_close(out_w, expected, atol=1e-5, rtol=1e-5)
    assert (weights * ~mask).abs().max() == 0


@pytest.mark.parametrize("variant", [{"variant": "sparse", "stride": 5}, {"variant": "axial", "row_length": 5}])
def test_a_learned_bias_trains_through_the_blockwise_path_as_through_the_dense_one(variant: dict, monkeypatch) -> None:
    """In training T5's table needs its gradient, which the fused kernel does not give: the pattern kernels then
    take the explicit blockwise path by themselves, and every gradient equals the dense path's."""
    from zoo.attention import pattern

    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, causal=True, position_bias="t5", num_buckets=8, max_distance=20, **variant)
    torch.nn.init.normal_(module.position_bias.relative_attention_bias.weight)
    x = torch.randn(2, 30, 32)
    grads = []
    for dense_max_length in (pattern.DENSE_MAX_LENGTH, 0):
        monkeypatch.setattr(pattern, "DENSE_MAX_LENGTH", dense_max_length)
        module.zero_grad()
        module(x).square().sum().backward()
        grads.append({name: p.grad.clone() for name, p in module.named_parameters()})
    assert grads[0]["position_bias.relative_attention_bias.weight"].abs().max() > 0
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-5)
