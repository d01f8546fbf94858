"""Data-side packing: documents split at files, lines or blank lines; batches of packed windows carry document ids
and leave the target after each document's <eos> out of the loss; GPT trains on them end to end."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_in_process, tiny_text
from zoo.data.sequences import TokenSequenceDataModule, pack_sequences
from zoo.data.text import IGNORE_INDEX, TextDataModule, document_targets, split_documents
from zoo.data.tokenizers import EOS
from zoo.errors import DataError


def test_documents_split_at_files_lines_or_blank_lines():
    text = "a b\nc\n\n  \nd e\nf\n"
    assert split_documents(text, "file") == [text]
    assert split_documents(text, "line") == ["a b", "c", "d e", "f"]
    assert split_documents(text, "blank_line") == ["a b\nc", "d e\nf"]


def test_targets_after_an_eos_are_ignored_and_the_eos_ends_its_document():
    eos = 9
    x = torch.tensor([[1, 2, eos, 3, eos, 4]])
    y = torch.tensor([[2, eos, 3, eos, 4, 5]])
    _, targets, document_ids = document_targets(x, y, eos)
    assert targets.tolist() == [[2, eos, IGNORE_INDEX, eos, IGNORE_INDEX, 5]]
    assert document_ids.tolist() == [[0, 0, 0, 1, 1, 2]]


@pytest.mark.parametrize("split", ["line", "blank_line"])
def test_packed_batches_start_a_document_after_every_eos(tmp_path, split):
    data = TextDataModule(
        str(tiny_text(tmp_path / "corpus.txt", repeats=20)), block_size=32, batch_size=4, packing=True,
        document_split=split, cache_dir=None,
    )  # fmt: skip
    data.setup()
    eos = data.tokenizer.token_to_id(EOS)
    x, y, document_ids = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == document_ids.shape == (4, 32)
    ends = x == eos
    assert ends.any() and (y[ends] == IGNORE_INDEX).all() and (y[~ends] >= 0).all()
    steps = document_ids.diff(dim=1)
    assert torch.equal(steps == 1, ends[:, :-1]) and (steps >= 0).all()
    x_val, y_val, ids_val = next(iter(data.val_dataloader()))
    assert ids_val.shape == x_val.shape and (y_val[x_val == eos] == IGNORE_INDEX).all()
    lines = len(split_documents((tmp_path / "corpus.txt").read_text(), split))
    assert int((data.tokens == eos).sum()) == lines  # one <eos> after every document


def test_an_unknown_document_split_is_one_line():
    with pytest.raises(
        DataError, match=r"data.document_split 'words'; valid choices: \['file', 'line', 'blank_line'\]"
    ):
        TextDataModule("x.txt", document_split="words")


def test_gpt_trains_one_batch_on_packed_documents(tmp_path, capsys):
    corpus = tiny_text(tmp_path / "corpus.txt", repeats=40)
    code, out, err = run_in_process(
        ["model=gpt", "data=text", f"data.path={corpus}", "data.packing=true", "data.document_split=blank_line",
         "trainer.fast_dev_run=true", "print_config=false", f"hydra.run.dir={tmp_path / 'run'}",
         f"paths.data_dir={tmp_path / 'data'}", "logger=csv"],
        capsys,
    )  # fmt: skip
    assert code == 0, (out + err)[-3000:]


def test_sequences_pack_first_fit_longest_first_with_their_labels():
    padded = [torch.tensor([3, 4, 5, 0, 0, 0]), torch.tensor([6, 0, 0, 0, 0, 0]), torch.tensor([7, 8, 9, 1, 2, 0])]
    samples = [(tokens, torch.tensor(label)) for tokens, label in zip(padded, (10, 11, 12))]
    ids, labels, document_ids = pack_sequences(samples, padding_id=0)
    assert ids.tolist() == [[7, 8, 9, 1, 2, 6], [3, 4, 5, 0, 0, 0]]
    assert labels.tolist() == [12, 11, 10]
    assert document_ids.tolist() == [[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]]


def test_packing_needs_padded_sequences():
    with pytest.raises(DataError, match="padding_id null"):
        TokenSequenceDataModule(padding_id=None, packing=True)


def test_sequence_classifier_trains_one_batch_on_packed_listops(tmp_path, capsys):
    code, out, err = run_in_process(
        ["model=sequence_classifier", "data=listops", "data.packing=true", "model.net.pool=mean",
         "data.max_length=64", "data.num_train=64", "data.num_val=16", "data.num_test=16",
         "trainer.fast_dev_run=true", "print_config=false", f"hydra.run.dir={tmp_path / 'run'}",
         f"paths.data_dir={tmp_path / 'data'}", "logger=csv"],
        capsys,
    )  # fmt: skip
    assert code == 0, (out + err)[-3000:]
