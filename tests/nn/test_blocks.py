"""A stack of Transformer blocks is built from one BlockConfig: every block holds it, each block takes its own
drop-path rate, a shared T5 bias is one module for the whole stack, and the config refuses what no block has."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from zoo.attention import AttentionConfig
from zoo.nn import BlockConfig, TransformerBlock, transformer_stack


def test_every_block_of_a_stack_holds_its_one_config_and_its_own_drop_path_rate() -> None:
    config = BlockConfig(dim=16, num_heads=2, causal=True)
    stack = transformer_stack(config, 3, drop_path=[0.0, 0.1, 0.2])
    assert all(isinstance(block, TransformerBlock) and block.config is config for block in stack)
    assert [block.drop_path.p for block in stack] == [0.0, 0.1, 0.2]
    with pytest.raises(ValueError, match=r"drop_path needs one rate per block \(3\), got 2"):
        transformer_stack(config, 3, drop_path=[0.0, 0.1])


@pytest.mark.parametrize("share_bias", [True, False])
def test_a_shared_t5_bias_is_one_module_for_the_stack(share_bias: bool) -> None:
    attention = AttentionConfig(position_bias="t5", share_bias=share_bias)
    stack = transformer_stack(BlockConfig(dim=16, num_heads=2, attention=attention), 3)
    biases = {id(block.self_attn.position_bias) for block in stack}
    assert len(biases) == (1 if share_bias else 3)


def test_cross_attention_is_the_variant_named_or_none() -> None:
    encoder = BlockConfig(dim=16, num_heads=2)
    decoder = dataclasses.replace(encoder, causal=True, cross_attention="full")
    assert TransformerBlock(encoder).cross_attn is None
    block = TransformerBlock(decoder).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    assert block(x, context=memory).shape == (2, 5, 16)


@pytest.mark.parametrize("field, value", [("norm", "batchnorm"), ("mlp", "moe")])
def test_the_config_refuses_a_norm_or_mlp_no_block_has(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"unknown {field} '{value}'; valid choices"):
        BlockConfig(dim=16, num_heads=2, **{field: value})


def test_the_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BlockConfig(dim=16, num_heads=2).dim = 32
