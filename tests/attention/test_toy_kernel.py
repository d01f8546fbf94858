"""Adding a kernel is one Kernel subclass, one entry in the registry and one yaml of its options
(docs/adding-a-kernel.md): a toy kernel added so, inside this test and with no other file touched, joins the
suite's variant tables, builds from `attention=<name>` and passes the generic property tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.attention import test_causality, test_decoding, test_errors_and_config
from tests.helpers import compose_config
from tests.variants import kernel_cases, settings_cases
from zoo.attention import AttentionConfig, MultiHeadAttention, registry
from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel
from zoo.attention.functional import dot_product_attention


# 1. The kernel file (zoo/attention/sharpened.py).
class SharpenedAttention(Kernel):
    """softmax(sharpness * q k^T / sqrt(d)) v: full attention with a sharper (sharpness > 1) or flatter softmax."""

    name = "sharpened"
    supports_cross_attention = True
    example_options = ({"sharpness": 2.0},)

    def __init__(self, *, sharpness: float = 1.0) -> None:
        super().__init__()
        if isinstance(sharpness, bool) or not isinstance(sharpness, (int, float)) or sharpness <= 0:
            raise ValueError(f"attention.sharpness must be a positive number, got {sharpness!r}")
        self.sharpness = sharpness

    def forward(self, q, k, v, call: AttentionCall):
        return dot_product_attention(
            q * self.sharpness, k, v, causal=call.causal, key_padding_mask=call.key_padding_mask,
            dropout_p=call.dropout_p, need_weights=call.need_weights,
        )  # fmt: skip

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(self, q, k, v, cache, call: AttentionCall):
        keys, values = cache.append(k, v, new_tokens_padding(call.key_padding_mask, k.shape[2]))
        return dot_product_attention(
            q * self.sharpness, keys, values, causal=True, key_padding_mask=cache.key_padding_mask(),
            need_weights=call.need_weights,
        )  # fmt: skip


# 3. Its yaml (conf/attention/sharpened.yaml): the shared settings from the base, then its own options.
YAML = """# Full attention with a sharper softmax (a toy).
defaults:
  - base/settings@_here_
  - _self_

variant: sharpened
sharpness: 1.0   # the factor on the scores: > 1 sharper, < 1 flatter
"""


@pytest.fixture
def sharpened(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Registers the toy kernel (2. the one line in zoo/attention/registry.py) and writes its yaml in a config
    folder that Hydra searches after conf/; returns that folder."""
    monkeypatch.setitem(registry.VARIANTS, "sharpened", SharpenedAttention)
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "sharpened.yaml").write_text(YAML)
    return tmp_path


def toy_cases(**capabilities: bool) -> list[tuple[str, dict]]:
    return [case for case in kernel_cases(**capabilities) if case[0] == "sharpened"]


def test_the_variant_tables_pick_up_a_new_kernel(sharpened: Path) -> None:
    assert toy_cases() == [("sharpened", {"sharpness": 2.0})]
    for capability in ("causal", "cross_attention", "decoding"):  # as its flags say
        assert toy_cases(**{capability: True}) == toy_cases(), capability
    assert toy_cases(position_bias=True) == []  # supports_position_bias is False
    assert settings_cases(decoding=True)["sharpened"] == {"variant": "sharpened", "sharpness": 2.0}


def test_attention_equals_the_new_kernel_picks_its_yaml(sharpened: Path) -> None:
    test_errors_and_config.assert_variant_yaml(sharpened / "attention" / "sharpened.yaml")
    cfg = compose_config(["attention=sharpened", "attention.sharpness=3.0", f"hydra.searchpath=[file://{sharpened}]"])
    config = AttentionConfig(**cfg.attention)
    assert config.to_dict() == {**AttentionConfig().to_dict(), "variant": "sharpened", "sharpness": 3.0}
    module = MultiHeadAttention(16, 2, config, causal=True)
    assert isinstance(module.kernel, SharpenedAttention) and module.kernel.sharpness == 3.0
    test_errors_and_config.one_line_error(lambda: AttentionConfig(variant="sharpened", sharpness=0), "sharpness", "0")


def test_the_generic_property_tests_run_on_a_new_kernel(sharpened: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variant, options in toy_cases(decoding=True):
        test_causality.test_future_tokens_change_no_earlier_output(variant, options, False, monkeypatch)
        test_decoding.test_cached_decoding_equals_full_forward(variant, options, True, [5] + [1] * 8)
        test_decoding.test_cache_reorder_follows_beam_search(variant, options)
        test_decoding.test_cached_decoding_with_other_settings_equals_full_forward(variant, options, "gqa")
    # And it computes what it says: sharpness 1 is full attention.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    expected, _ = dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(SharpenedAttention(sharpness=1.0)(q, k, v, causal=True)[0], expected)
