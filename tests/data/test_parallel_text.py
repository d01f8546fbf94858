"""Parallel-corpus data: reading files, bad input, joint BPE, length-bucketed token batches."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from zoo.data.parallel_text import (
    Multi30kDataModule,
    NumbersDataModule,
    ParallelTextDataModule,
    TokenBatchSampler,
    decode_ids,
    read_parallel,
)
from zoo.data.tokenizers import BOS, EOS, PAD
from zoo.errors import DataError

PAIRS = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bike."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Kinder spielen im Park.", "Children play in the park."),
]


def write(path: Path, lines: list[str]) -> str:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


def test_reads_tsv_and_two_aligned_files_plain_or_gzipped(tmp_path: Path) -> None:
    source, target = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    tsv = write(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in PAIRS])
    files = [write(tmp_path / "x.de.gz", source), write(tmp_path / "x.en", target)]
    assert read_parallel(tsv, "data.train") == (source, target)
    assert read_parallel(files, "data.train") == (source, target)


def test_bad_parallel_input_is_one_line_naming_the_value(tmp_path: Path) -> None:
    short = write(tmp_path / "short.en", ["one"])
    long = write(tmp_path / "long.de", ["eins", "zwei"])
    with pytest.raises(DataError, match=r"data.val: .*long.de' has 2 lines but .*short.en' has 1"):
        read_parallel([long, short], "data.val")
    with pytest.raises(DataError, match=r"data.train: file not found: .*missing.tsv"):
        read_parallel(str(tmp_path / "missing.tsv"), "data.train")
    with pytest.raises(DataError, match="data.test must be a TSV path or a list of two paths"):
        read_parallel("", "data.test")
    with pytest.raises(DataError, match=r"data.train: file is empty"):
        read_parallel(write(tmp_path / "empty.tsv", []), "data.train")
    with pytest.raises(DataError, match="line 1 of .* has 1 tab-separated columns, expected 2"):
        read_parallel(write(tmp_path / "bad.tsv", ["no tab here"]), "data.train")
    for error in (DataError, ValueError):
        with pytest.raises(error, match=r"data.direction must be .* of \['de', 'en'\], got 'de-xx'"):
            NumbersDataModule(direction="de-xx")


def test_token_batches_cover_every_pair_once_within_the_budget() -> None:
    lengths = [3, 9, 4, 12, 5, 5, 7, 2, 11, 6] * 5
    sampler = TokenBatchSampler(lengths, max_tokens=24, shuffle=True, seed=0)
    first, second = list(sampler), list(sampler)
    for batches in (first, second):
        assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
        assert all(len(batch) * max(lengths[i] for i in batch) <= 24 for batch in batches)
        assert len(batches) == len(sampler)
    assert first != second  # a new order every epoch
    assert list(TokenBatchSampler(lengths, 24, shuffle=True, seed=0)) == first  # reproducible from the seed
    # Bucketing: similar lengths travel together, so padding is far below random batching.
    padded = sum(len(b) * max(lengths[i] for i in b) for b in first)
    assert padded < 1.2 * sum(lengths)
    with pytest.raises(DataError, match="data.max_tokens=8 is shorter than the longest sequence"):
        TokenBatchSampler(lengths, max_tokens=8)


def text_module(tmp_path: Path, **kwargs) -> ParallelTextDataModule:
    tsv = write(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in PAIRS * 5])
    return ParallelTextDataModule(train=tsv, val=tsv, test=tsv, vocab_size=300, max_tokens=64, **kwargs)


def test_batches_frame_targets_with_bos_eos_and_joint_bpe_round_trips(tmp_path: Path) -> None:
    module = text_module(tmp_path)
    module.setup("fit")
    tokenizer = module.tokenizer
    assert [tokenizer.token_to_id(t) for t in (PAD, BOS, EOS)] == [0, 1, 2]
    batch = next(iter(module.val_dataloader()))
    src, tgt = batch["src"], batch["tgt"]
    assert src.shape[0] == tgt.shape[0] == len(batch["src_text"])
    for row in range(src.shape[0]):
        source = [i for i in src[row].tolist() if i != 0]
        target = [i for i in tgt[row].tolist() if i != 0]
        assert source[-1] == 2 and target[0] == 1 and target[-1] == 2
        assert decode_ids(tokenizer, source) == batch["src_text"][row]  # detokenizes exactly
        assert decode_ids(tokenizer, target) == batch["tgt_text"][row]
    # One vocabulary for both languages: German and English words alike become single tokens.
    assert tokenizer.token_to_id("Ġspielen") is not None and tokenizer.token_to_id("Ġplay") is not None


def test_training_pairs_longer_than_max_length_are_dropped(tmp_path: Path) -> None:
    module = text_module(tmp_path, max_length=16)
    module.setup("fit")
    train, test = module.dataset("train"), module.dataset("test")
    assert 0 < len(train) < len(test) == len(PAIRS) * 5
    assert max(train.lengths()) <= 16 and max(test.lengths()) <= 16  # evaluation sentences are truncated


def test_use_tokenizer_reencodes_with_the_given_vocabulary(tmp_path: Path) -> None:
    module, other = text_module(tmp_path), text_module(tmp_path, seed=1)
    module.setup()
    other.tokenizer = None
    other.texts = {split: (["x y z"] * 5, ["z y x"] * 5) for split in ("train", "val", "test")}
    other.setup()
    before = module.dataset("val").source[0]
    module.use_tokenizer(other.tokenizer)
    assert module.tokenizer is other.tokenizer
    assert module.dataset("val").source[0] != before


def test_numbers_corpus_is_deterministic_disjoint_and_written_out() -> None:
    module = NumbersDataModule(num_train=300, num_val=20, num_test=20, max_digits=4, vocab_size=300)
    splits = module.load()
    assert splits == NumbersDataModule(num_train=300, num_val=20, num_test=20, max_digits=4).load()
    assert [len(splits[s][0]) for s in ("train", "val", "test")] == [300, 20, 20]
    sources = [set(splits[s][0]) for s in ("train", "val", "test")]
    assert not (sources[0] & sources[1]) and not (sources[0] & sources[2]) and not (sources[1] & sources[2])
    pairs = dict(zip(*splits["train"]))
    if "einundzwanzig" in pairs:
        assert pairs["einundzwanzig"] == "twenty-one"
    assert all(" " not in de or de.startswith("eine ") for de in pairs)  # German compounds
    reverse = NumbersDataModule(num_train=300, num_val=20, num_test=20, max_digits=4, direction="en-de").load()
    assert reverse["train"] == (splits["train"][1], splits["train"][0])
    with pytest.raises(DataError, match="data.max_digits=2 allows only 100 numbers, 340 requested"):
        NumbersDataModule(num_train=300, num_val=20, num_test=20, max_digits=2)


def test_multi30k_reads_its_files_in_either_direction_and_explains_a_missing_folder(tmp_path: Path) -> None:
    for split in ("train", "val", "test_2016_flickr"):
        write(tmp_path / f"{split}.de.gz", [p[0] for p in PAIRS])
        write(tmp_path / f"{split}.en.gz", [p[1] for p in PAIRS])
    de_en = Multi30kDataModule(data_dir=str(tmp_path), download=False).load()
    en_de = Multi30kDataModule(data_dir=str(tmp_path), direction="en-de", download=False).load()
    assert de_en["test"][0][0] == "Ein Mann fährt Fahrrad." and en_de["test"][0][0] == "A man rides a bike."
    with pytest.raises(DataError, match=r"data.direction must be .*got 'de-de'"):
        Multi30kDataModule(data_dir=str(tmp_path), direction="de-de")
    with pytest.raises(DataError, match=r"file not found: .*nowhere/train.de.gz"):
        Multi30kDataModule(data_dir=str(tmp_path / "nowhere"), download=False).load()
