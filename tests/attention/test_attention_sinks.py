"""Attention sinks (attention.sink_tokens=s) in causal local attention: the forward equals full attention under
the (window or first-s-tokens) mask, cached decoding equals the forward, the cache stays O(s + window), and
decoding far past the window stays finite and equal to the uncached forward."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout
from zoo.attention.functional import masked_attention
from zoo.attention.sinks import SinkKVCache, sink_window_mask, sliding_window_attention_with_sinks
from zoo.models.gpt import GPT, GPTConfig


@pytest.mark.parametrize(("length", "window", "sinks", "block"), [(40, 8, 4, 16), (37, 5, 1, 7), (20, 32, 3, 8)])
def test_sink_attention_equals_masked_full_attention(length, window, sinks, block) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, length, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, length, 8, dtype=torch.float64), torch.randn(2, 2, length, 8, dtype=torch.float64)
    positions = torch.arange(length)
    allowed = sink_window_mask(positions, positions, window, sinks)
    expected, _ = masked_attention(q, k, v, allowed)
    out, _ = sliding_window_attention_with_sinks(q, k, v, window, sinks, block_size=block)
    torch.testing.assert_close(out, expected)
    assert allowed[-1, :sinks].all() and not allowed[-1, sinks : max(sinks, length - window)].any()


def test_cache_keeps_the_sinks_and_the_window_only() -> None:
    cache = SinkKVCache(window=4, sinks=2)
    for step in range(10):
        cache.extend(torch.full((1, 1, 1, 2), float(step)), torch.zeros(1, 1, 1, 2))
    assert cache.positions.tolist() == [0, 1, 7, 8, 9]
    assert cache.keys[0, 0, :, 0].tolist() == [0.0, 1.0, 7.0, 8.0, 9.0]


@pytest.mark.parametrize("rope", [False, True])
def test_decoding_far_past_the_window_equals_the_forward_and_stays_finite(rope) -> None:
    torch.manual_seed(0)
    attention = AttentionConfig(variant="local", window=6, sink_tokens=2, rope=rope, kv_heads=1)
    module = MultiHeadAttention(16, 2, attention, causal=True, layout=TokenLayout(max_length=64)).double().eval()
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    expected = module(x)
    cache = module.new_cache()
    steps = [module(x[:, :9], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(9, 50)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)
    assert cache.keys.shape[2] == 2 + 5  # the sinks and window - 1 keys, after 50 tokens


def test_gpt_with_sinks_generates_cached_as_uncached() -> None:
    torch.manual_seed(0)
    attention = {"variant": "local", "window": 6, "sink_tokens": 2, "rope": True, "rope_scaling": "linear",
                 "rope_factor": 2.0}  # fmt: skip
    model = GPT(GPTConfig(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=16, attention=attention)).eval()
    prompt = torch.randint(0, 23, (1, 5))
    cached = model.generate(prompt, 40, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 40, temperature=0, use_cache=False))


def test_sinks_refuse_what_they_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"^attention.sink_tokens must be an int >= 0 \(0: no attention sinks\), "):
        AttentionConfig(variant="local", sink_tokens=-1)
    module = MultiHeadAttention(16, 2, AttentionConfig(variant="local", window=4, sink_tokens=2))  # bidirectional
    with pytest.raises(ValueError, match="keeps the first tokens of a causal window.*causal=False"):
        module(torch.randn(1, 8, 16))
