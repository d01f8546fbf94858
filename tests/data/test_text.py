"""Text data modules: deterministic splits, nanoGPT batches, one tokenisation cached and memory-mapped."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from zoo.data.text import FixedBlocks, PythonStdlibDataModule, RandomBlocks, ShakespeareDataModule, TextDataModule
from zoo.data.tokenizers import EOS
from zoo.errors import DataError

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i % 7}\n" for i in range(300))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_char_split_is_the_token_stream_cut_at_fixed_fractions(corpus: Path) -> None:
    data = TextDataModule(path=str(corpus), block_size=16, val_fraction=0.1, test_fraction=0.05)
    data.setup()
    tokens = data.tokens
    assert len(tokens) == len(TEXT)  # char level: one token per character
    assert data.tokenizer.decode(tokens.tolist()) == TEXT
    n = len(TEXT)
    assert len(data.splits["train"]) == int(n * 0.85)
    assert len(data.splits["val"]) == int(n * 0.95) - int(n * 0.85)
    assert np.array_equal(np.concatenate([data.splits[s] for s in ("train", "val", "test")]), tokens)
    assert tokens.dtype == np.uint16


def test_training_batches_are_random_windows_of_the_train_split_with_shifted_targets(corpus: Path) -> None:
    data = TextDataModule(path=str(corpus), block_size=16, batch_size=5, seed=3)
    data.setup()
    batches = iter(data.train_dataloader())
    x, y = next(batches)
    assert x.shape == y.shape == (5, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    train_text = data.tokenizer.decode(data.splits["train"].tolist())
    for row_x, row_y in zip(x, y):
        window = data.tokenizer.decode(row_x.tolist() + row_y[-1:].tolist())
        assert window in train_text
    again = next(iter(data.train_dataloader()))
    assert torch.equal(again[0], x)  # same seed, same stream
    assert not torch.equal(next(batches)[0], x)


def test_batch_i_depends_only_on_seed_and_i_so_resume_and_ranks_are_exact() -> None:
    tokens = np.arange(1000, dtype=np.uint16)

    def take(blocks: RandomBlocks, count: int, **loader) -> list[torch.Tensor]:
        return [x for x, _ in itertools.islice(iter(DataLoader(blocks, batch_size=None, **loader)), count)]

    stream = take(RandomBlocks(tokens, 8, 6, seed=1), 10)
    assert len({tuple(x[:, 0].tolist()) for x in stream}) == 10  # ten different batches
    resumed = take(RandomBlocks(tokens, 8, 6, seed=1, start=lambda: 4), 6)  # a run resumed after 4 batches
    assert all(torch.equal(a, b) for a, b in zip(resumed, stream[4:]))
    ranks = [take(RandomBlocks(tokens, 8, 3, seed=1, rank=r, world_size=2), 10) for r in (0, 1)]
    assert all(torch.equal(torch.cat([a, b]), one) for a, b, one in zip(*ranks, stream))  # the global batch
    workers = take(RandomBlocks(tokens, 8, 6, seed=1), 10, num_workers=2)
    assert all(torch.equal(a, b) for a, b in zip(workers, stream))  # two workers, same order
    assert not torch.equal(take(RandomBlocks(tokens, 8, 6, seed=2), 1)[0], stream[0])


def test_evaluation_windows_tile_the_split_or_are_a_fixed_sample(corpus: Path) -> None:
    split = np.arange(100, dtype=np.uint16)
    tiles = FixedBlocks(split, block_size=8, count=None, seed=0)
    assert len(tiles) == 12  # starts 0, 8, ..., 88: every window has 9 tokens
    assert torch.equal(tiles[11][0], torch.arange(88, 96)) and torch.equal(tiles[11][1], torch.arange(89, 97))
    sample = FixedBlocks(split, block_size=8, count=30, seed=0)
    assert len(sample) == 30 and torch.equal(sample.starts, FixedBlocks(split, 8, 30, 0).starts)
    data = TextDataModule(path=str(corpus), block_size=16, eval_batch_size=4, eval_batches=3)
    data.setup()
    assert len(data.val_dataloader()) == 3


def test_bpe_round_trips_and_files_are_joined_with_eos(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / f"{i}.txt").write_text(TEXT[i * 1000 : (i + 3) * 1000])
    data = TextDataModule(path=str(tmp_path / "docs"), tokenizer="bpe", vocab_size=300, block_size=8)
    data.setup()
    eos = data.tokenizer.token_to_id(EOS)
    assert data.vocab_size == 300
    assert int((data.tokens == eos).sum()) == 2
    pieces = np.split(np.asarray(data.tokens), np.flatnonzero(data.tokens == eos))
    decoded = [data.tokenizer.decode(p[p != eos].tolist()) for p in pieces]
    assert decoded == [TEXT[i * 1000 : (i + 3) * 1000] for i in range(3)]
    assert len(data.tokens) < 0.8 * sum(len(d) for d in decoded)  # BPE merges characters


def test_cache_dir_tokenises_once_and_memory_maps(corpus: Path, tmp_path: Path) -> None:
    first = TextDataModule(path=str(corpus), block_size=16, cache_dir=str(tmp_path / "cache"))
    first.setup()
    (folder,) = (tmp_path / "cache").iterdir()
    assert {p.name for p in folder.iterdir()} == {"tokens.bin", "tokenizer.json", "meta.json"}
    second = TextDataModule(path=str(corpus), block_size=16, cache_dir=str(tmp_path / "cache"))
    second.setup()
    assert isinstance(second.tokens, np.memmap)
    assert np.array_equal(second.tokens, first.tokens)
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    corpus.write_text(TEXT + "new text\n")  # a changed file is tokenised again
    TextDataModule(path=str(corpus), block_size=16, cache_dir=str(tmp_path / "cache")).setup()
    assert len(list((tmp_path / "cache").iterdir())) == 2


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_special_tokens_are_reserved_and_read_as_one_token(corpus: Path, tmp_path: Path, kind: str) -> None:
    options = {"tokenizer": kind, "vocab_size": 300 if kind == "bpe" else None, "cache_dir": str(tmp_path / "cache")}
    plain = TextDataModule(path=str(corpus), block_size=16, **options)
    plain.setup()
    data = TextDataModule(path=str(corpus), block_size=16, special_tokens=["[MASK]", "[CLS]", "<pad>"], **options)
    data.setup()
    tokenizer = data.tokenizer
    assert plain.tokenizer.token_to_id("[MASK]") is None
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>", "[MASK]", "[CLS]")] == list(range(6))
    assert tokenizer.encode("the [MASK] fox", add_special_tokens=False).ids.count(4) == 1
    assert plain.cache_key(plain.sources()) != data.cache_key(data.sources())  # cached apart
    with pytest.raises(DataError, match="data.special_tokens must be a list of non-empty strings, got '\\[MASK\\]'"):
        TextDataModule(path=str(corpus), special_tokens="[MASK]")


def test_bad_paths_are_one_line_errors(tmp_path: Path) -> None:
    def setup(**kwargs) -> None:
        TextDataModule(block_size=8, **kwargs).setup()

    with pytest.raises(DataError, match="data.path must name text files"):
        setup(path=None)
    with pytest.raises(DataError, match="missing.txt"):
        setup(path=str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="corpus is empty"):
        setup(path=str(tmp_path / "empty.txt"))
    (tmp_path / "binary.txt").write_bytes(b"abc\xff\xfe\x00")
    with pytest.raises(DataError, match="binary.txt.*not utf-8 text.*data.encoding"):
        setup(path=str(tmp_path / "binary.txt"))
    (tmp_path / "short.txt").write_text("a few words only\n")
    with pytest.raises(DataError, match="too few for data.block_size=8"):
        setup(path=str(tmp_path / "short.txt"))
    with pytest.raises(DataError, match="unknown data.tokenizer 'words'; valid choices"):
        TextDataModule(path="x", tokenizer="words")
    with pytest.raises(DataError, match="data.vocab_size must be set"):
        TextDataModule(path="x", tokenizer="bpe")


def test_python_stdlib_corpus_needs_no_download() -> None:
    data = PythonStdlibDataModule(modules=["textwrap", "json"], block_size=32, test_fraction=0.0)
    data.setup()
    text = data.tokenizer.decode(data.tokens[:5000].tolist())
    assert "def " in text or "class " in text
    with pytest.raises(DataError, match="'no_such_module' is not a pure-Python module"):
        PythonStdlibDataModule(modules=["no_such_module"]).setup()


def test_shakespeare_reads_a_local_copy_and_explains_when_it_cannot(corpus: Path, tmp_path: Path) -> None:
    data = ShakespeareDataModule(path=str(corpus), data_dir=str(tmp_path / "data"), block_size=16)
    assert data.sources() == [corpus]
    offline = ShakespeareDataModule(path=str(tmp_path / "nope.txt"), data_dir=str(tmp_path / "data"), download=False)
    with pytest.raises(DataError, match="nope.txt.*download disabled.*set data.path"):
        offline.sources()
