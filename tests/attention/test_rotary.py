"""Rotary position embedding: relative by construction, the same numbers as Hugging Face LLaMA, and its length
scalings (linear, dynamic NTK as transformers computes them; static NTK as its formula)."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import AttentionConfig, MultiHeadAttention, RotaryEmbedding, TokenLayout


def test_rotary_scores_depend_only_on_relative_offset_1d() -> None:
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> torch.Tensor:
        return (rope.rotate(q, torch.tensor([m])) * rope.rotate(k, torch.tensor([n]))).sum()

    base = score(7, 3)
    for shift in (1, 10, 1000):
        torch.testing.assert_close(score(7 + shift, 3 + shift), base, atol=1e-4, rtol=1e-4)
    assert (score(7, 3) - score(9, 3)).abs() > 1e-3  # a different offset gives a different score


def test_rotary_scores_depend_only_on_relative_offset_2d() -> None:
    rope = RotaryEmbedding(16, n_axes=2)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: tuple[int, int], n: tuple[int, int]) -> torch.Tensor:
        return (rope.rotate(q, torch.tensor([m])) * rope.rotate(k, torch.tensor([n]))).sum()

    base = score((2, 5), (4, 1))
    for shift in ((1, 0), (0, 3), (7, 11)):
        shifted = score((2 + shift[0], 5 + shift[1]), (4 + shift[0], 1 + shift[1]))
        torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    assert (score((2, 5), (4, 1)) - score((2, 5), (4, 2))).abs() > 1e-3  # each axis matters
    assert (score((2, 5), (4, 1)) - score((2, 6), (4, 1))).abs() > 1e-3


def test_rotary_matches_hugging_face_llama() -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim, base = 32, 10000.0
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim, rope_theta=base)
    positions = torch.tensor([[0, 1, 2, 5, 17, 300, 4095]])
    q, k = torch.randn(1, 2, 7, head_dim), torch.randn(1, 2, 7, head_dim)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)

    rope = RotaryEmbedding(head_dim, base)
    got_q, got_k = rope.rotate_queries_keys(q, k, positions[0])
    torch.testing.assert_close(got_q, expected_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, expected_k, atol=1e-5, rtol=1e-5)
    # The cached table for consecutive positions gives the same numbers as explicit positions.
    table_q = rope.rotate(q[:, :, :3].contiguous(), offset=0)
    torch.testing.assert_close(table_q, expected_q[:, :, :3], atol=1e-5, rtol=1e-5)


def test_explicit_positions_are_not_confused_with_a_cached_range() -> None:
    rope = RotaryEmbedding(8)
    x = torch.randn(1, 1, 3, 8)
    contiguous = rope.rotate(x, torch.tensor([0, 1, 2]))
    strided = rope.rotate(x, torch.tensor([0, 2, 4]))  # same start and length, other positions
    assert not torch.allclose(contiguous, strided)
    torch.testing.assert_close(strided[:, :, 1], rope.rotate(x[:, :, 1:2], torch.tensor([2]))[:, :, 0])


@pytest.mark.parametrize("variant", ["full", "local", "linear"])
def test_rope_module_is_translation_invariant_for_every_variant(variant: str) -> None:
    # Relative positions: shifting all positions leaves the output unchanged (causal, no padding).
    torch.manual_seed(0)
    window = {"window": 4} if variant == "local" else {}
    module = MultiHeadAttention(32, 2, variant=variant, **window, rope=True, causal=True)
    x = torch.randn(2, 9, 32)
    shifted = module(x, positions=torch.arange(100, 109))
    if variant == "linear":  # phi(rotated q) . phi(rotated k) is not a function of the offset alone
        assert not torch.allclose(shifted, module(x), atol=1e-4)
    else:
        torch.testing.assert_close(shifted, module(x), atol=1e-4, rtol=1e-4)


def test_rope_module_moves_and_casts_without_losing_frequency_precision() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 2, rope=True, causal=True)
    x = torch.randn(1, 6, 32)
    expected = module(x)
    module = module.to(torch.float64).to("cpu")  # nn.Module.to must reach the rotary submodule
    assert module.rotary.inv_freq.dtype == torch.float32  # frequencies stay fp32 whatever the model dtype
    torch.testing.assert_close(module(x.double()).float(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scaling", ["linear", "dynamic"])
@pytest.mark.parametrize("length", [40, 64, 100, 256])
def test_rope_scaling_matches_transformers_rotary_embedding(scaling: str, length: int) -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=64,
        rope_parameters={"rope_type": scaling, "factor": 4.0, "rope_theta": 10000.0},
    )  # fmt: skip
    positions = torch.arange(length)
    # A fresh transformers module per length: it keeps the largest dynamic base it has seen, zoo's does not.
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1, 1, length, 32), positions[None])
    module = MultiHeadAttention(
        64, 2, rope=True, rope_scaling=scaling, rope_factor=4.0, layout=TokenLayout(max_length=64)
    )  # the config's fields reach the rotary embedding; the trained length is the layout's
    for got in (module.rotary.cos_sin(positions), module.rotary.cos_sin(None, length=length)):
        torch.testing.assert_close(got[0], cos[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(got[1], sin[0], atol=1e-6, rtol=0)
    plain = RotaryEmbedding(32).cos_sin(positions)[0]
    assert (scaling == "dynamic" and length <= 64) == torch.allclose(plain, cos[0], atol=1e-6)


def test_static_ntk_scaling_is_its_formula() -> None:
    head_dim, base, factor = 32, 10000.0, 4.0
    rope = MultiHeadAttention(64, 2, rope=True, rope_scaling="ntk", rope_factor=factor, rope_base=base).rotary
    scaled_base = base * factor ** (head_dim / (head_dim - 2))  # bloc97's NTK-aware base
    expected = scaled_base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    torch.testing.assert_close(rope.inv_freq.double(), expected, atol=0, rtol=1e-6)
    positions = torch.arange(300)
    angles = positions[:, None].double() * expected
    torch.testing.assert_close(
        rope.cos_sin(positions)[0].double(), torch.cat([angles, angles], -1).cos(), atol=1e-4, rtol=0
    )
    assert (
        rope.inv_freq[0] == 1.0 and rope.inv_freq[-1] < RotaryEmbedding(head_dim).inv_freq[-1] / 3
    )  # low freqs stretch


def test_rope_scaling_errors_name_the_choices() -> None:
    from .test_errors_and_config import one_line_error

    one_line_error(
        lambda: AttentionConfig(rope=True, rope_scaling="longrope"), "'longrope'", "dynamic, linear, llama3, ntk, yarn"
    )
    one_line_error(lambda: AttentionConfig(rope_scaling="linear"), "rope_scaling='linear'", "attention.rope=true")
    one_line_error(lambda: AttentionConfig(rope=True, rope_scaling="ntk", rope_factor=0.5), "rope_factor", "0.5")
    one_line_error(lambda: MultiHeadAttention(32, 4, rope=True, rope_scaling="dynamic"), "dynamic", "max_length")
    grid = TokenLayout(max_length=5, grid=(2, 2), prefix_tokens=1)
    one_line_error(
        lambda: MultiHeadAttention(32, 4, rope=True, rope_scaling="linear", rope_factor=2.0, layout=grid),
        "grid",
        "rope",
    )
    for scaling in ("linear", "ntk"):  # a factor of 1 would silently be plain RoPE; dynamic NTK still grows its base
        build = lambda s=scaling: AttentionConfig(rope=True, rope_scaling=s)  # noqa: E731
        one_line_error(build, repr(scaling), "rope_factor=1", "> 1")
    AttentionConfig(rope=True, rope_scaling="dynamic")
