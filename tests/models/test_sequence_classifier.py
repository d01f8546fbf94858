"""The sequence classifier: the shared encoder trunk (the same blocks ViT and CLIP's text tower run), padding
masked out of attention and pooling, both poolings, RoPE, every registered attention variant."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import VARIANTS
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
from zoo.nn import EncoderTrunk, TransformerBlock


def tiny(**overrides) -> SequenceClassifier:
    torch.manual_seed(0)
    settings = {"vocab_size": 16, "max_length": 12, "num_classes": 5, "dim": 16, "depth": 2, "num_heads": 2}
    return SequenceClassifier(SequenceClassifierConfig(**{**settings, **overrides})).eval()


def test_the_trunk_is_the_shared_encoder_stack() -> None:
    model = tiny()
    assert isinstance(model, EncoderTrunk) and all(isinstance(block, TransformerBlock) for block in model.blocks)
    assert not any(block.self_attn.causal for block in model.blocks)  # a classifier sees the whole sequence
    names = {name.split(".")[0] for name, _ in model.named_parameters()}
    assert names == {"token_embedding", "cls_token", "pos_embed", "blocks", "norm", "head"}


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_output_shapes_for_both_poolings(pool: str) -> None:
    model = tiny(pool=pool)
    tokens = torch.randint(0, 16, (3, 12))
    features, mask = model.forward_features(tokens)
    assert features.shape == (3, 12 + (pool == "cls"), 16) and mask is None
    assert model(tokens).shape == (3, 5)


def test_mean_pooling_averages_the_features() -> None:
    cls, mean = tiny(pool="cls"), tiny(pool="mean")
    tokens = torch.randint(0, 16, (2, 6))
    features, _ = mean.forward_features(tokens)
    torch.testing.assert_close(mean(tokens), mean.head(features.mean(dim=1)))
    features, _ = cls.forward_features(tokens)
    torch.testing.assert_close(cls(tokens), cls.head(features[:, 0]))


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_padding_changes_nothing_for_every_variant(pool: str, variant: str) -> None:
    model = tiny(pool=pool, padding_id=0, attention={"variant": variant})
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would hide any difference
    tokens = torch.randint(1, 16, (2, 7))
    padded = torch.cat([tokens, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), model(tokens), atol=1e-5, rtol=1e-5)
    unmasked = tiny(pool=pool, padding_id=None, attention={"variant": variant})
    unmasked.load_state_dict(model.state_dict())
    assert (unmasked(padded) - model(padded)).abs().max() > 1e-4  # without padding_id the zeros are tokens


def test_rope_replaces_the_position_table_and_positions_matter() -> None:
    model = tiny(attention={"variant": "full", "rope": True})
    assert model.pos_embed is None
    torch.nn.init.normal_(model.head.weight)
    tokens = torch.randint(0, 16, (1, 12))
    assert (model(tokens) - model(tokens.flip(1))).abs().max() > 1e-4
    learned = tiny()
    assert learned.pos_embed.weight.shape == (13, 16)  # the class token has a position too


def test_sequences_longer_than_max_length_are_an_error() -> None:
    with pytest.raises(ValueError, match="13 tokens exceeds sequence_classifier max_length=12"):
        tiny()(torch.zeros(1, 13, dtype=torch.long))


@pytest.mark.parametrize(
    "settings, message",
    [({"pool": "max"}, "valid choices"), ({"padding_id": 16}, "padding_id"), ({"depth": 0}, "depth")],
)
def test_bad_configs_are_one_line_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny(**settings)


def test_dropout_and_drop_path_act_in_training_only() -> None:
    model = tiny(dropout=0.3, drop_path=0.3)
    torch.nn.init.normal_(model.head.weight)
    tokens = torch.randint(0, 16, (4, 12))
    assert torch.equal(model(tokens), model(tokens))
    model.train()
    assert not torch.allclose(model(tokens), model(tokens))
