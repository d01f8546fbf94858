"""Rotary position embedding: relative by construction, and the same numbers as Hugging Face LLaMA."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import MultiHeadAttention, RotaryEmbedding


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
    module = MultiHeadAttention(32, 2, variant=variant, window=4, rope=True, causal=True)
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
