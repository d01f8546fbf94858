"""YaRN and llama3 RoPE scaling equal transformers' rope init functions (frequencies and attention factor), and
its rotary module's cos/sin, for several settings."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import AttentionConfig, MultiHeadAttention, RotaryEmbedding, TokenLayout

CASES = {
    "yarn": ("yarn", 4.0, {"original_max_position_embeddings": 64}),
    "yarn_betas_untruncated": ("yarn", 8.0, {"original_max_position_embeddings": 128, "beta_fast": 16,
                                             "beta_slow": 2, "truncate": False}),
    "yarn_mscale": ("yarn", 16.0, {"original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 1.0}),
    "yarn_attention_factor": ("yarn", 2.0, {"original_max_position_embeddings": 64, "attention_factor": 1.3}),
    "llama3": ("llama3", 8.0, {"original_max_position_embeddings": 64}),
    "llama3_factors": ("llama3", 4.0, {"original_max_position_embeddings": 256, "low_freq_factor": 2.0,
                                       "high_freq_factor": 8.0}),
    "linear": ("linear", 2.0, {}),
    "dynamic": ("dynamic", 2.0, {}),
}  # fmt: skip
HEAD_DIM, HEADS, THETA, MAX_POSITIONS = 32, 2, 5000.0, 512


def transformers_config(scaling: str, factor: float, parameters: dict):
    from transformers import LlamaConfig

    rope = {"rope_type": scaling, "rope_theta": THETA, "factor": factor, **parameters}
    if scaling == "llama3":
        rope = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, **rope}
    return LlamaConfig(
        hidden_size=HEAD_DIM * HEADS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS, rope_parameters=rope,
    )  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_scaling_equals_transformers_rope_init_functions(case: str) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling, factor, parameters = CASES[case]
    config = transformers_config(scaling, factor, parameters)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[scaling](config, "cpu")
    ours = RotaryEmbedding(HEAD_DIM, THETA, scaling=scaling, factor=factor, trained_length=MAX_POSITIONS,
                           parameters=parameters or None)  # fmt: skip
    torch.testing.assert_close(ours.inv_freq, inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_factor == pytest.approx(attention_factor, rel=1e-12)


@pytest.mark.parametrize("case", ["yarn", "yarn_mscale", "llama3"])
def test_scaled_cos_sin_equal_transformers_rotary_module(case: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling, factor, parameters = CASES[case]
    theirs = LlamaRotaryEmbedding(transformers_config(scaling, factor, parameters))
    positions = torch.arange(0, 700, 7)[None]
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions)
    attention = AttentionConfig(rope=True, rope_base=THETA, rope_scaling=scaling, rope_factor=factor,
                                rope_parameters=parameters)  # fmt: skip
    module = MultiHeadAttention(HEAD_DIM * HEADS, HEADS, attention, layout=TokenLayout(max_length=MAX_POSITIONS))
    our_cos, our_sin = module.rotary.cos_sin(positions[0])
    torch.testing.assert_close(our_cos, cos[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_sin, sin[0], rtol=1e-5, atol=1e-5)
    table_cos, _ = module.rotary.cos_sin(None, length=700)  # the cached table of consecutive positions
    torch.testing.assert_close(table_cos[::7], cos[0], rtol=1e-5, atol=1e-5)


def test_original_length_defaults_to_the_trained_length_and_scaling_extrapolates() -> None:
    explicit = RotaryEmbedding(HEAD_DIM, scaling="yarn", factor=4.0, trained_length=64,
                               parameters={"original_max_position_embeddings": 64})  # fmt: skip
    implicit = RotaryEmbedding(HEAD_DIM, scaling="yarn", factor=4.0, trained_length=64)
    torch.testing.assert_close(implicit.inv_freq, explicit.inv_freq)
    assert AttentionConfig(rope=True, rope_scaling="llama3", rope_factor=8.0).extrapolates


def test_unknown_rope_parameter_is_a_one_line_error_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown attention.rope_parameters key 'beta_fast' for "
                       r"rope_scaling='llama3'; valid: original_max_position_embeddings, low_freq_factor, "
                       r"high_freq_factor$"):  # fmt: skip
        AttentionConfig(rope=True, rope_scaling="llama3", rope_factor=8.0, rope_parameters={"beta_fast": 4})
    with pytest.raises(ValueError, match="rope_scaling=None; valid: none"):
        AttentionConfig(rope=True, rope_parameters={"beta_fast": 4})
