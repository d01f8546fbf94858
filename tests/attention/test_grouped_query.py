"""Grouped-query attention equals multi-head attention with each key/value head repeated for its group (Llama's
repeat_kv), for every variant; equals transformers' LlamaAttention with copied weights; its caches shrink."""

from __future__ import annotations

import pytest
import torch

from tests.variants import kernel_cases, settings_cases, supports
from zoo.attention import MultiHeadAttention, TokenLayout, repeat_kv

from .helpers import random_padding

DIM, HEADS, HEAD_DIM = 32, 4, 8
LAYOUT = TokenLayout(max_length=16)  # kernels sized by the model's length (compressed attention) take 13 tokens
# Every kernel with each example, and each kernel that takes a position bias also with ALiBi and with T5's.
BIASED = {
    f"{variant}+{bias}": {"variant": variant, **options, "position_bias": bias}
    for variant, options in kernel_cases(position_bias=True, grouped=True, first_only=True)
    for bias in ("alibi", "t5")
}
VARIANTS = {**settings_cases(grouped=True), **BIASED}


def repeated_rows(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """(G * hd, ...) rows of key or value heads -> (G * groups * hd, ...): each head's rows `groups` times."""
    heads = weight.view(-1, HEAD_DIM, *weight.shape[1:])
    return heads.repeat_interleave(groups, dim=0).flatten(0, 1)


def twins(settings: dict, kv_heads: int, causal: bool) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A GQA module and the MHA module that repeats its key/value heads, with the same weights."""
    torch.manual_seed(0)
    grouped = MultiHeadAttention(DIM, HEADS, causal=causal, kv_heads=kv_heads, layout=LAYOUT, **settings)
    full = MultiHeadAttention(DIM, HEADS, causal=causal, layout=LAYOUT, **settings)
    groups = HEADS // kv_heads
    with torch.no_grad():
        for name in ("weight", "bias"):
            q, k, v = getattr(grouped.in_proj, name).split([DIM, kv_heads * HEAD_DIM, kv_heads * HEAD_DIM])
            getattr(full.in_proj, name).copy_(torch.cat([q, repeated_rows(k, groups), repeated_rows(v, groups)]))
        full.out_proj.load_state_dict(grouped.out_proj.state_dict())
        # The same FAVOR+ random features, Linformer projections (one per query head), T5 table.
        full.kernel.load_state_dict(grouped.kernel.state_dict())
        if grouped.position_bias is not None:
            full.position_bias.load_state_dict(grouped.position_bias.state_dict())
    grouped.kernel.eval(), full.kernel.eval()  # kernels that draw in training (lsh's hashes) draw the same in both
    return grouped, full


def test_repeat_kv_equals_llama() -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import repeat_kv as llama_repeat_kv

    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(repeat_kv(x, 4), llama_repeat_kv(x, 4))


CASES = [(name, causal) for name in sorted(VARIANTS) for causal in (False, True)]


@pytest.mark.parametrize(
    ("name", "causal"), [case for case in CASES if not case[1] or supports(VARIANTS[case[0]]["variant"], "causal")]
)
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_equals_repeated_key_value_heads(name: str, kv_heads: int, causal: bool) -> None:
    grouped, full = twins(VARIANTS[name], kv_heads, causal)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 13, DIM, generator=generator)
    padding = random_padding(2, 13, generator)
    x_grouped, x_full = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = grouped(x_grouped, key_padding_mask=padding)
    expected = full(x_full, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x_grouped.grad, x_full.grad, atol=1e-5, rtol=1e-5)
    # A shared key/value head's gradient is the sum over the query heads of its group.
    kv = kv_heads * HEAD_DIM
    _, k_grad, v_grad = grouped.in_proj.weight.grad.split([DIM, kv, kv])
    _, k_full, v_full = full.in_proj.weight.grad.split([DIM, DIM, DIM])
    summed = k_full.view(kv_heads, HEADS // kv_heads, HEAD_DIM, DIM).sum(1).flatten(0, 1)
    torch.testing.assert_close(k_grad, summed, atol=1e-5, rtol=1e-5)
    summed = v_full.view(kv_heads, HEADS // kv_heads, HEAD_DIM, DIM).sum(1).flatten(0, 1)
    torch.testing.assert_close(v_grad, summed, atol=1e-5, rtol=1e-5)

    # need_weights: one map per query head, as with the repeated heads.
    out_w, weights = grouped(x, key_padding_mask=padding, need_weights=True)
    expected_w, expected_weights = full(x, key_padding_mask=padding, need_weights=True)
    assert weights.shape == (2, HEADS, 13, 13)
    torch.testing.assert_close(out_w, expected_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def cache_bytes(cache) -> int:
    tensors = [getattr(cache, name, None) for name in ("keys", "values", "state")]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@pytest.mark.parametrize("name", sorted(settings_cases(decoding=True, grouped=True)))
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_caches_hold_kv_heads_and_shrink_by_num_heads_over_kv_heads(name: str, kv_heads: int) -> None:
    grouped, full = twins(VARIANTS[name], kv_heads, causal=True)
    x = torch.randn(2, 21, DIM)
    caches = []
    for module in (grouped.eval(), full.eval()):
        cache = module.new_cache()
        outputs = [module(x[:, :7], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(7, 21)]
        caches.append(cache)
        torch.testing.assert_close(torch.cat(outputs, dim=1), module(x), atol=1e-5, rtol=1e-5)
    stored = [getattr(caches[0], key) for key in ("keys", "state") if getattr(caches[0], key, None) is not None]
    assert stored and all(tensor.shape[1] == kv_heads for tensor in stored)
    assert cache_bytes(caches[1]) == cache_bytes(caches[0]) * HEADS // kv_heads


@pytest.mark.parametrize("name", sorted(settings_cases(cross_attention=True)))
def test_cross_attention_caches_kv_heads(name: str) -> None:
    grouped, full = twins(VARIANTS[name], 2, causal=False)
    x, context = torch.randn(2, 5, DIM), torch.randn(2, 9, DIM)
    padding = random_padding(2, 9, torch.Generator().manual_seed(4))
    expected = full(x, context, key_padding_mask=padding)
    torch.testing.assert_close(grouped(x, context, key_padding_mask=padding), expected, atol=1e-5, rtol=1e-5)
    cache = grouped.new_cache(cross_attention=True)
    grouped(x[:, :1], context, cache=cache, key_padding_mask=padding)
    assert cache.keys.shape == (2, 2, 9, HEAD_DIM)
    out, weights = grouped(x[:, 1:], context, cache=cache, key_padding_mask=padding, need_weights=True)
    torch.testing.assert_close(out, expected[:, 1:], atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, HEADS, 4, 9)


def test_grouped_query_attention_matches_transformers_llama_attention() -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=DIM, num_attention_heads=HEADS, num_key_value_heads=2, head_dim=HEAD_DIM, attention_bias=False,
        max_position_embeddings=64,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = LlamaAttention(config, layer_idx=0).eval()
    ours = MultiHeadAttention(DIM, HEADS, rope=True, kv_heads=2, causal=True, bias=False).eval()
    with torch.no_grad():  # Llama's q, k, v projections stacked are in_proj's rows
        ours.in_proj.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
        ours.out_proj.weight.copy_(theirs.o_proj.weight)
    length = 11
    x = torch.randn(2, length, DIM)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    position_embeddings = LlamaRotaryEmbedding(config)(x, torch.arange(length)[None])
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    expected, _ = theirs(x_theirs, position_embeddings=position_embeddings, attention_mask=mask)
    out = ours(x_ours)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, atol=1e-5, rtol=1e-5)
    their_grads = torch.cat([theirs.q_proj.weight.grad, theirs.k_proj.weight.grad, theirs.v_proj.weight.grad])
    torch.testing.assert_close(ours.in_proj.weight.grad, their_grads, atol=1e-5, rtol=1e-5)
