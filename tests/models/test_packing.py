"""Packed documents are exact: the logits of a packed block equal those of its documents run one by one, for
causal GPT and the bidirectional sequence classifier, every registered variant that supports packing (with each of
its example options: tests/variants.py) and each way of giving positions (learned table, RoPE, ALiBi, T5)."""

from __future__ import annotations

import pytest
import torch

from tests.variants import case_id, kernel_cases, supports
from zoo.attention import AttentionConfig, PackedDocuments
from zoo.attention.registry import VARIANTS, packing_variants
from zoo.models.gpt import GPT, GPTConfig
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig

POSITIONS = {"learned": {}, "rope": {"rope": True}, "alibi": {"position_bias": "alibi"}, "t5": {"position_bias": "t5"}}
LENGTHS = [[5, 1, 9, 3], [7, 11]]  # documents per row: a one-token document, and rows of 18 tokens


def _cases() -> list:
    cases = []
    for variant, options in kernel_cases(packing=True):
        if options.get("random_keys"):
            continue  # ruled out with one line: test_random_keys_refuse_packing
        for position, settings in POSITIONS.items():
            if "position_bias" in settings and not supports(variant, "position_bias"):
                continue  # no scores to bias (AttentionConfig rejects the pair)
            cases.append(pytest.param(variant, options, settings, id=f"{case_id(variant, options)}-{position}"))
    return cases


def _packed_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    rows, ids, documents = [], [], []
    for lengths in LENGTHS:
        docs = [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]
        rows.append(torch.cat(docs))
        ids.append(torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]))
        documents.append(docs)
    return torch.stack(rows), torch.stack(ids), documents


def _attention(variant: str, options: dict, settings: dict) -> AttentionConfig:
    return AttentionConfig(variant=variant, **options, **settings)


@pytest.mark.parametrize(("variant", "options", "settings"), _cases())
def test_packed_gpt_logits_equal_documents_run_alone(variant, options, settings):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=24, n_layer=2, n_head=2, n_embd=16)
    config.attention = _attention(variant, options, settings)
    model = GPT(config).double().eval()
    tokens, document_ids, documents = _packed_batch(32)
    with torch.no_grad():
        packed = model(tokens, document_ids=document_ids)
        for row, docs in enumerate(documents):
            start = 0
            for doc in docs:
                alone = model(doc[None])[0]
                torch.testing.assert_close(packed[row, start : start + len(doc)], alone, rtol=1e-10, atol=1e-10)
                start += len(doc)


@pytest.mark.parametrize(("variant", "options", "settings"), _cases())
def test_packed_classifier_logits_equal_documents_run_alone(variant, options, settings):
    torch.manual_seed(0)
    config = SequenceClassifierConfig(vocab_size=32, max_length=24, num_classes=3, dim=16, depth=2, num_heads=2)
    config.pool = "mean"
    config.attention = _attention(variant, options, settings)
    model = SequenceClassifier(config).double().eval()
    for parameter in model.head.parameters():  # the head starts at zero: give it weights that tell logits apart
        torch.nn.init.normal_(parameter)
    tokens, document_ids, documents = _packed_batch(32, seed=1)
    with torch.no_grad():
        packed = model(tokens, document_ids=document_ids)
        alone = torch.cat([model(doc[None]) for docs in documents for doc in docs])
    assert packed.shape == (sum(map(len, LENGTHS)), 3)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)


def test_packing_is_not_a_mean_over_the_row():
    """The check above can fail: the same block without document ids mixes documents."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=24, n_layer=1, n_head=2, n_embd=16)).double().eval()
    tokens, document_ids, documents = _packed_batch(32)
    with torch.no_grad():
        packed, unpacked = model(tokens, document_ids=document_ids), model(tokens)
        second = model(documents[0][1][None])[0]
    torch.testing.assert_close(packed[0, 5:6], second)
    assert not torch.allclose(unpacked[0, 5:6], second)


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - set(packing_variants())))
def test_kernels_without_packing_refuse_in_one_line(variant):
    config = GPTConfig(vocab_size=32, block_size=24, n_layer=1, n_head=2, n_embd=16)
    options = VARIANTS[variant].example_options[0]
    if not VARIANTS[variant].supports_causal:
        model = SequenceClassifier(
            SequenceClassifierConfig(vocab_size=32, max_length=24, dim=16, depth=1, num_heads=2, pool="mean",
                                     attention=AttentionConfig(variant=variant, **options))
        )  # fmt: skip
    else:
        config.attention = AttentionConfig(variant=variant, **options)
        model = GPT(config)
    tokens, document_ids, _ = _packed_batch(32)
    with pytest.raises(ValueError, match=f"not supported by attention variant '{variant}'; valid choices: ") as error:
        model(tokens, document_ids=document_ids)
    assert "\n" not in str(error.value) and "'full'" in str(error.value)


def test_random_keys_refuse_packing():
    config = GPTConfig(vocab_size=32, block_size=24, n_layer=1, n_head=2, n_embd=16)
    config.attention = AttentionConfig(variant="sparse", stride=4, random_keys=2)
    tokens, document_ids, _ = _packed_batch(32)
    with pytest.raises(ValueError, match="random_keys=2"):
        GPT(config)(tokens, document_ids=document_ids)


def test_classifier_with_a_class_token_asks_for_mean_pooling():
    model = SequenceClassifier(SequenceClassifierConfig(vocab_size=32, max_length=24, dim=16, depth=1, num_heads=2))
    tokens, document_ids, _ = _packed_batch(32)
    with pytest.raises(ValueError, match=r"set pool=mean \(model.net.pool=mean\), got pool='cls'"):
        model(tokens, document_ids=document_ids)


def test_document_positions_restart_at_each_document():
    documents = PackedDocuments.from_ids(torch.tensor([[0, 0, 0, 1, 1, 0], [3, 3, 3, 3, 3, 3]]))
    assert documents.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert documents.num_documents == 4


@pytest.mark.parametrize(("variant", "options"), kernel_cases(packing=True, first_only=True))
def test_packed_rows_with_trailing_padding_equal_documents_run_alone(variant, options):
    """What data.packing hands the classifier: rows ending in padding tokens (masked out), a one-token document."""
    torch.manual_seed(0)
    attention = AttentionConfig(variant=variant, **options)
    config = SequenceClassifierConfig(
        vocab_size=32, max_length=24, num_classes=3, dim=16, depth=2, num_heads=2, padding_id=0, pool="mean",
        attention=attention,
    )  # fmt: skip
    model = SequenceClassifier(config).double().eval()
    torch.nn.init.normal_(model.head.weight)
    generator = torch.Generator().manual_seed(2)
    docs = [torch.randint(1, 32, (n,), generator=generator) for n in (6, 1, 9, 4)]
    tokens = torch.zeros(2, 20, dtype=torch.long)
    document_ids = torch.zeros(2, 20, dtype=torch.long)
    tokens[0, :16], document_ids[0, 6:], document_ids[0, 7:] = torch.cat(docs[:3]), 1, 2
    tokens[1, :4] = docs[3]
    with torch.no_grad():
        packed = model(tokens, document_ids=document_ids)
        alone = torch.cat([model(doc[None]) for doc in docs])
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)
