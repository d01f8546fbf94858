"""Incremental decoding with each variant's cache equals running the whole sequence at once, also with
position biases, grouped key/value heads, other feature maps and RoPE scaling."""

from __future__ import annotations

import pytest
import torch

from tests.variants import is_pattern_kernel, kernel_cases, supports, takes
from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout

from .helpers import random_padding, use_blockwise_path

VARIANTS = kernel_cases(decoding=True)  # (variant, options)
PATTERN_VARIANTS = [case for case in VARIANTS if is_pattern_kernel(case[0])]
SOFTMAX_VARIANTS = kernel_cases(decoding=True, position_bias=True)  # the kernels that form scores


def build(variant: str, options: dict, rope: bool, **settings) -> MultiHeadAttention:
    torch.manual_seed(0)
    chunks = {"chunk_size": 4} if takes(variant, "chunk_size") else {}
    settings = {**chunks, **options, **settings}  # the settings under test replace an example's
    module = MultiHeadAttention(32, 4, variant=variant, causal=True, rope=rope, layout=TokenLayout(max_length=8),
                                **settings).eval()  # fmt: skip
    if module.position_bias is not None and hasattr(module.position_bias, "relative_attention_bias"):
        torch.nn.init.normal_(module.position_bias.relative_attention_bias.weight)  # a bias that matters
    return module


def decode(module: MultiHeadAttention, x: torch.Tensor, pieces: list[int], padding: torch.Tensor | None = None):
    cache = module.new_cache()
    outputs, start = [], 0
    for size in pieces:
        # The mask may cover all keys so far (B, offset + t) or only the new ones; alternate to test both.
        end = start + size
        mask = None if padding is None else (padding[:, :end] if len(outputs) % 2 else padding[:, start:end])
        outputs.append(module(x[:, start:end], key_padding_mask=mask, cache=cache))
        start = end
    assert cache.offset == x.shape[1]
    return torch.cat(outputs, dim=1), cache


@pytest.mark.parametrize(("variant", "options"), VARIANTS)
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("pieces", [[1] * 13, [5] + [1] * 8, [6, 3, 1, 1, 2]])
def test_cached_decoding_equals_full_forward(variant: str, options: dict, rope: bool, pieces: list[int]) -> None:
    module = build(variant, options, rope)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    expected = module(x)
    got, _ = decode(module, x, pieces)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("variant", "options"), SOFTMAX_VARIANTS)
@pytest.mark.parametrize("position_bias", ["alibi", "t5"])
@pytest.mark.parametrize("pieces", [[1] * 13, [5] + [1] * 8, [6, 3, 1, 1, 2]])
def test_cached_decoding_with_a_position_bias_equals_full_forward(variant, options, position_bias, pieces) -> None:
    module = build(variant, options, rope=False, position_bias=position_bias, num_buckets=8, max_distance=12)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    got, _ = decode(module, x, pieces)
    torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)


SETTINGS = {
    "gqa": {"kv_heads": 2},
    "mqa": {"kv_heads": 1},
    "relu": {"feature_map": "relu"},
    "favor": {"feature_map": "favor", "num_features": 24},
    "rope_linear": {"rope": True, "rope_scaling": "linear", "rope_factor": 2.0},
    "rope_ntk": {"rope": True, "rope_scaling": "ntk", "rope_factor": 2.0},
}
# Each setting with the variants that take it: the feature maps are linear attention's options (another variant
# refuses them), the rest are MultiHeadAttention's own.
SETTINGS_CASES = [
    (variant, options, name) for variant, options in VARIANTS for name in sorted(SETTINGS)
    if all(takes(variant, key) for key in SETTINGS[name] if key not in AttentionConfig.setting_names())
]  # fmt: skip


@pytest.mark.parametrize(("variant", "options", "name"), SETTINGS_CASES)
def test_cached_decoding_with_other_settings_equals_full_forward(variant: str, options: dict, name: str) -> None:
    settings = {"rope": False, **SETTINGS[name]}
    module = build(variant, options, **settings)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    got, _ = decode(module, x, [5] + [1] * 8)
    torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("variant", "options"), VARIANTS)
def test_dynamic_rope_decoding_equals_full_forward_within_the_trained_length(variant, options) -> None:
    # Past the trained length (8 here) every call rescales its own rotations, as in transformers, so only
    # the first 8 tokens can agree with a full forward.
    module = build(variant, options, rope=True, rope_scaling="dynamic", rope_factor=2.0)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    got, _ = decode(module, x, [3] + [1] * 5)
    torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)
    longer = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(decode(module, longer, [12])[0][:, :8], module(longer[:, :8]), atol=1e-4)


# The pattern kernels also with their blockwise path (fused or explicit) for the whole sequence and the
# first chunk (below DENSE_MAX_LENGTH tokens they take the dense one).
PADDED_CASES = [(variant, options, None) for variant, options in VARIANTS]
PADDED_CASES += [(variant, options, fused) for variant, options in PATTERN_VARIANTS for fused in (True, False)]


@pytest.mark.parametrize(("variant", "options", "blockwise"), PADDED_CASES)
@pytest.mark.parametrize(
    "settings",
    [{}, {"position_bias": "alibi", "kv_heads": 2}, {"position_bias": "t5", "kv_heads": 1, "num_buckets": 8}],
    ids=["plain", "alibi_gqa", "t5_mqa"],
)
def test_cached_decoding_with_left_padding_equals_full_forward(variant, options, blockwise, settings, monkeypatch):
    if blockwise is not None:
        use_blockwise_path(monkeypatch, fused=blockwise)
    if not supports(variant, "position_bias") and "position_bias" in settings:
        settings = {"kv_heads": 2}
    module = build(variant, options, rope=True, **settings)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 12, 32, generator=generator)
    padding = random_padding(3, 12, generator, left=True)
    expected = module(x, key_padding_mask=padding)
    got, _ = decode(module, x, [4, 1, 1, 3, 1, 1, 1], padding)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("variant", "options"), VARIANTS)
def test_cache_reorder_follows_beam_search(variant: str, options: dict) -> None:
    module = build(variant, options, rope=True)
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(3))
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, :3] = True  # the cache must carry each row's padding along with its keys
    indices = torch.tensor([1, 0, 1])
    _, cache = decode(module, x[:, :6], [6], padding[:, :6])
    cache.reorder(indices)
    continued = torch.cat([module(x[indices, i : i + 1], cache=cache) for i in range(6, 10)], dim=1)
    expected = module(x[indices], key_padding_mask=padding[indices])[:, 6:]
    torch.testing.assert_close(continued, expected, atol=1e-5, rtol=1e-5)


def test_local_cache_keeps_only_the_window() -> None:
    module = build("local", {"window": 4}, rope=False)
    _, cache = decode(module, torch.randn(1, 20, 32), [7] + [1] * 13)
    assert cache.keys.shape[2] == 3 and cache.values.shape[2] == 3  # window - 1 past keys


def test_linear_state_has_constant_size() -> None:
    module = build("linear", {}, rope=False)
    _, cache = decode(module, torch.randn(1, 20, 32), [1] * 20)
    assert cache.state.shape == (1, 4, 8, 9)  # [S | z]: head_dim x (head_dim + 1)
    favor = build("linear", {}, rope=False, feature_map="favor", num_features=24, kv_heads=2)
    _, cache = decode(favor, torch.randn(1, 20, 32), [1] * 20)
    assert cache.state.shape == (1, 2, 24, 9)  # per key/value head: features x (head_dim + 1)
