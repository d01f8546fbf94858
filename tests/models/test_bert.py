"""BERT and RoBERTa: post-norm bidirectional blocks computed as their definition, the tied MLM head with its bias,
the pooler, fairseq's position ids, padding masked out under every bidirectional attention variant; and
transformers' BertForMaskedLM / RobertaForMaskedLM (random tiny configs, as models and as saved folders) giving
the same logits in zoo and back, with padding and token types; unsupported config fields refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from tests.variants import settings_cases
from zoo.errors import CheckpointError
from zoo.models.bert import BERT, BERTConfig
from zoo.nn import TransformerBlock

VOCAB = 100


def tiny(**overrides) -> BERT:
    torch.manual_seed(0)
    settings = {"vocab_size": VOCAB, "max_length": 24, "dim": 32, "depth": 2, "num_heads": 4, "dropout": 0.0}
    return BERT(BERTConfig(**{**settings, **overrides})).eval()


def test_blocks_are_post_norm_and_bidirectional_as_defined() -> None:
    model = tiny()
    assert all(isinstance(block, TransformerBlock) and not block.self_attn.causal for block in model.blocks)
    block = model.blocks[0]
    x = torch.randn(2, 7, 32)
    # BERT's layer: x = LN(x + Attention(x)); x = LN(x + MLP(x)). A pre-norm block would differ.
    h = block.norm1(x + block.self_attn(x))
    expected = block.norm2(h + block.mlp(h))
    torch.testing.assert_close(block(x), expected)
    assert not any(name.startswith("norm") for name, _ in model.named_children())  # no final LayerNorm


def test_a_later_token_changes_an_earlier_ones_logits() -> None:
    model = tiny()
    ids = torch.randint(2, VOCAB, (1, 8))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % VOCAB
    with torch.no_grad():
        assert (model(ids)[0, 0] - model(changed)[0, 0]).abs().max() > 1e-4


def test_mlm_head_is_tied_to_the_token_embedding_with_a_bias_of_its_own() -> None:
    model = tiny()
    assert model.mlm_head.decoder.weight is model.token_embedding.weight
    with torch.no_grad():
        model.mlm_head.decoder.bias.normal_()
    ids = torch.randint(0, VOCAB, (2, 9))
    features = model.forward_features(ids)
    head = model.mlm_head
    expected = head.norm(torch.nn.functional.gelu(head.dense(features))) @ model.token_embedding.weight.T
    torch.testing.assert_close(model(ids), expected + head.decoder.bias)


def test_masked_positions_give_those_rows_of_the_logits() -> None:
    model = tiny()
    ids = torch.randint(0, VOCAB, (3, 10))
    masked = torch.rand(3, 10, generator=torch.Generator().manual_seed(0)) < 0.3
    torch.testing.assert_close(model(ids, masked=masked), model(ids)[masked])


def test_pooler_is_dense_and_tanh_of_the_first_token() -> None:
    model = tiny()
    features = model.forward_features(torch.randint(0, VOCAB, (2, 6)))
    torch.testing.assert_close(model.pool(features), torch.tanh(model.pooler(features[:, 0])))
    assert model.pool(features).shape == (2, 32)


def test_token_types_and_positions_change_the_logits() -> None:
    model = tiny()
    ids = torch.randint(2, VOCAB, (1, 8))
    with torch.no_grad():
        plain = model(ids)
        assert (model(ids, token_type_ids=torch.ones_like(ids)) - plain).abs().max() > 1e-4
        model.position_embedding.weight[3].add_(torch.randn(32))  # not a constant: LayerNorm removes one
        assert (model(ids)[0, 3] - plain[0, 3]).abs().max() > 1e-4


def test_activation_mlp_width_and_dropout_are_honoured() -> None:
    relu = tiny(activation="relu", mlp_dim=24)
    assert relu.blocks[0].mlp.fc1.out_features == 24
    assert relu.blocks[0].mlp.act is relu.mlm_head.act is torch.nn.functional.relu
    gelu = tiny(mlp_dim=24)
    gelu.load_state_dict(relu.state_dict())
    ids = torch.randint(2, VOCAB, (1, 8))
    with torch.no_grad():
        assert (relu(ids) - gelu(ids)).abs().max() > 1e-5
    dropped = tiny(dropout=0.5).train()
    with torch.no_grad():
        assert (dropped(ids) - dropped(ids)).abs().max() > 1e-4  # a new mask each forward in training
        torch.testing.assert_close(dropped.eval()(ids), dropped.eval()(ids))


def test_roberta_position_ids_count_the_non_padding_tokens() -> None:
    model = tiny(position_ids="roberta", padding_id=1)
    ids = torch.tensor([[5, 6, 7, 1, 1], [1, 1, 5, 6, 7]])
    assert model.position_ids(ids).tolist() == [[2, 3, 4, 1, 1], [1, 1, 2, 3, 4]]
    assert tiny().position_ids(ids).tolist() == [[0, 1, 2, 3, 4]] * 2
    with torch.no_grad():  # left padding leaves a sentence's logits as they were
        torch.testing.assert_close(model(ids[1:])[0, 2:], model(ids[1:, 2:])[0], atol=1e-5, rtol=1e-5)
    assert model.max_length == 24 - 2


@pytest.mark.parametrize(("name", "attention"), sorted(settings_cases().items()))
def test_padding_changes_nothing_for_every_bidirectional_variant(name: str, attention: dict) -> None:
    model = tiny(attention=attention)
    ids = torch.randint(2, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)  # padding_id 0
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :7], model(ids), atol=1e-5, rtol=1e-5)
        unmasked = model(padded, key_padding_mask=torch.zeros_like(padded, dtype=torch.bool))
        assert (unmasked[:, :7] - model(ids)).abs().max() > 1e-4  # without the mask the zeros are tokens
    model.train()
    model(padded).logsumexp(-1).mean().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_rope_replaces_the_position_table() -> None:
    model = tiny(attention={"rope": True})
    assert model.position_embedding is None
    ids = torch.randint(2, VOCAB, (1, 8))
    swapped = ids[:, [1, 0, *range(2, 8)]]
    with torch.no_grad():
        for block in model.blocks:  # scores large enough for the rotation to show
            block.self_attn.in_proj.weight.normal_()
        # without positions, swapping two tokens would only swap their logits
        assert (model(swapped)[0, 0] - model(ids)[0, 1]).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"position_ids": "t5"}, "bert position_ids"),
        ({"dim": 30}, "bert dim must be divisible by num_heads, got dim=30 and num_heads=4"),
        ({"padding_id": 100}, r"bert padding_id must be null or in \[0, vocab_size=100\), got 100"),
        ({"position_ids": "roberta", "padding_id": None}, "bert position_ids=roberta counts positions from padding_id"),
        ({"depth": 0}, "bert depth must be a positive int"),
    ],
)
def test_bad_configs_are_one_line_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny(**settings)


def test_too_long_a_sequence_is_an_error() -> None:
    with pytest.raises(ValueError, match="sequence of 25 tokens exceeds the bert model's max_length=24"):
        tiny()(torch.zeros(1, 25, dtype=torch.long))


# -- Hugging Face ----------------------------------------------------------------------------------------------

ARCHITECTURES = {"bert": ("BertForMaskedLM", "BertConfig", 0), "roberta": ("RobertaForMaskedLM", "RobertaConfig", 1)}


def tiny_huggingface(architecture: str, seed: int = 0, **overrides):
    """A transformers masked LM of `architecture` with a random tiny config; weights drawn wider than its init (and
    biases non-zero) so that every tensor counts."""
    import transformers

    model_name, config_name, padding_id = ARCHITECTURES[architecture]
    fields = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=padding_id, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )  # fmt: skip
    fields.update(overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**fields)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.2)
    return model


def inputs(architecture: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask (rows padded on the right, one on the left) and token types."""
    generator = torch.Generator().manual_seed(seed)
    padding_id = ARCHITECTURES[architecture][2]
    ids = torch.randint(2, VOCAB, (4, 12), generator=generator)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    mask[3, :3] = 0  # left padding
    ids[mask == 0] = padding_id
    types = torch.randint(0, 2, (4, 12), generator=generator)
    return ids, mask, types


def logit_difference(ours: BERT, theirs, architecture: str) -> float:
    ids, mask, types = inputs(architecture)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(ids, token_type_ids=types, key_padding_mask=mask == 0)
    return float((got - expected)[mask.bool()].abs().max())


@pytest.mark.parametrize("source", ["model", "folder"])
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_masked_lm_gives_transformers_logits(architecture: str, source: str, tmp_path) -> None:
    theirs = tiny_huggingface(architecture)
    if source == "folder":
        theirs.save_pretrained(tmp_path)
    ours = BERT.from_huggingface(tmp_path if source == "folder" else theirs).eval()
    assert ours.config.position_ids == architecture and ours.config.padding_id == ARCHITECTURES[architecture][2]
    assert ours.config.dropout == 0.1 and ours.config.attention.dropout == 0.1
    assert logit_difference(ours, theirs, architecture) <= 1e-4


def test_the_attention_mask_matters_and_defaults_to_the_padding_tokens() -> None:
    theirs = tiny_huggingface("bert")
    ours = BERT.from_huggingface(theirs).eval()
    ids, mask, types = inputs("bert")
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        derived = ours(ids, token_type_ids=types)  # padding_id 0 marks the padding
        unmasked = ours(ids, token_type_ids=types, key_padding_mask=torch.zeros_like(mask, dtype=torch.bool))
    keep = mask.bool()
    assert (derived - expected)[keep].abs().max() <= 1e-4
    assert (unmasked - expected)[keep].abs().max() > 1e-3


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_export_writes_the_architecture_back_with_equal_logits(architecture: str, tmp_path) -> None:
    import transformers

    theirs = tiny_huggingface(architecture)
    ours = BERT.from_huggingface(theirs).eval()
    ours.to_huggingface().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[architecture][0]]
    again = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert logit_difference(ours, again, architecture) <= 1e-4
    fresh = tiny(position_ids=architecture, padding_id=ARCHITECTURES[architecture][2], max_length=40)
    with torch.no_grad():
        fresh.mlm_head.decoder.bias.normal_()
    assert logit_difference(fresh, fresh.to_huggingface().eval(), architecture) <= 1e-4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"position_embedding_type": "relative_key"},
         "unsupported Hugging Face field position_embedding_type='relative_key'; valid: 'absolute'"),
        ({"is_decoder": True}, "unsupported Hugging Face field is_decoder=True; valid: False"),
        ({"add_cross_attention": True}, "unsupported Hugging Face field add_cross_attention=True; valid: False"),
        ({"tie_word_embeddings": False}, "unsupported Hugging Face field tie_word_embeddings=False; valid: True"),
        ({"architectures": ["BertModel"]},
         "unsupported Hugging Face architecture 'BertModel'; valid: BertForMaskedLM, RobertaForMaskedLM"),
        ({"hidden_act": "mish"}, "unsupported Hugging Face activation 'mish'"),
    ],
)  # fmt: skip
def test_unsupported_fields_are_refused_in_one_line(change: dict, message: str, tmp_path) -> None:
    tiny_huggingface("bert").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(
        CheckpointError, match="config.json: " + message.replace("(", r"\(").replace("[", r"\[")
    ) as error:
        BERT.from_huggingface(tmp_path)
    assert "\n" not in str(error.value)


def test_roberta_with_another_activation_is_refused(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="hidden_act='relu' for RoBERTa .*; valid: 'gelu'"):
        BERT.from_huggingface(tiny_huggingface("roberta", hidden_act="relu"))


def test_weights_of_another_shape_are_named(tmp_path) -> None:
    tiny_huggingface("bert").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(
        CheckpointError, match=r"intermediate.dense.bias is \(48,\) in the weights, config.json implies \(64,\)"
    ):
        BERT.from_huggingface(tmp_path)


def test_another_attention_variant_over_imported_weights() -> None:
    theirs = tiny_huggingface("bert")
    ours = BERT.from_huggingface(theirs, attention={"variant": "local", "window": 64}).eval()
    assert ours.config.attention.variant == "local" and ours.config.attention.dropout == 0.1
    assert logit_difference(ours, theirs, "bert") <= 1e-4  # a window wider than the sequence: full attention


@pytest.mark.parametrize(
    ("attention", "message"),
    [
        ({"variant": "linear"}, "attention.variant='linear' \\(valid: full\\)"),
        ({"rope": True}, "positions inside attention"),
    ],
)
def test_export_refuses_what_bert_has_not(attention: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"BERT and RoBERTa have none of: {message}"):
        tiny(attention=attention).to_huggingface()
