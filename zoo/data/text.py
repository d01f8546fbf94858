"""Text corpora for language modelling: files -> tokenizer -> one flat token array -> random blocks.

As in nanoGPT, the corpus is tokenised once into a compact array of token ids (uint16 while the vocabulary
fits), split by position into train | val | test, and training batches are windows of block_size + 1 tokens
at random offsets (inputs, and targets shifted by one). There are no epochs: train for trainer.max_steps.
With `cache_dir` the array and the tokenizer are written once to disk and memory-mapped afterwards, so
corpora larger than memory work and later runs skip tokenisation.

Packing (`data.packing=true`): the corpus is already one stream of documents joined by <eos> (between files, or
between lines or paragraphs with `data.document_split`), so a window of it packs several documents; with packing
each batch also carries per-token document ids, the model attends within each document only (positions
restarting at its first token: zoo/attention/documents.py) and the target after a document's <eos> (the next
document's first token) is left out of the loss. The window's first document is usually a fragment: it starts at
position 0 as if it were whole, as in packed pre-training.

Corpora: your own files (TextDataModule, `data=text data.path=...`), tiny-shakespeare
(ShakespeareDataModule) and, needing no download at all, the source of Python standard-library modules
read from the running interpreter (PythonStdlibDataModule, the default of `model=gpt`).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from zoo.data.splits import SplitDataModule
from zoo.data.tokenizers import (
    EOS,
    KINDS,
    SPECIAL_TOKENS,
    batched,
    tokenizer_from_string,
    tokenizer_to_string,
    train_tokenizer,
)
from zoo.errors import DataError

log = logging.getLogger("zoo")

CHUNK_CHARS = 1 << 20  # files are read and encoded in line-aligned chunks of about this many characters
CACHE_VERSION = 1  # bump when the cached layout or the tokenisation changes
# Where a document ends in the token stream (an <eos> follows it): at the end of each file, each line, or each
# blank-line-separated paragraph. Files are the default because that is what the stream always marked.
DOCUMENT_SPLITS = ("file", "line", "blank_line")
IGNORE_INDEX = -100  # cross_entropy's default ignore_index: targets that cross a document boundary


def split_documents(text: str, document_split: str) -> list[str]:
    """The documents of a line-aligned chunk of text: itself (file), its non-blank lines, or its paragraphs."""
    if document_split == "file":
        return [text]
    if document_split == "line":
        return [line for line in text.splitlines() if line.strip()]
    paragraphs: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    return ["\n".join(lines) for lines in paragraphs if lines]


def document_targets(x: torch.Tensor, y: torch.Tensor, eos: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs and targets (B, T) of a packed window -> (x, targets, document ids (B, T)).

    A document ends with its <eos>, which belongs to it (the model learns to end a document); the target after an
    <eos> is the next document's first token, which nothing in the window may predict: IGNORE_INDEX.
    """
    ends = x == eos
    document_ids = ends.long().cumsum(dim=1) - ends.long()
    return x, y.masked_fill(ends, IGNORE_INDEX), document_ids


def window_batch(tokens: np.ndarray, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows tokens[s : s + block_size + 1] -> inputs x and next-token targets y, both (B, block_size) int64."""
    windows = np.stack([tokens[s : s + block_size + 1] for s in starts.tolist()]).astype(np.int64)
    windows = torch.from_numpy(windows)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class RandomBlocks(IterableDataset):
    """An endless stream of (x, y) batches at uniformly random offsets (nanoGPT's get_batch), where batch
    number i is a pure function of (seed, i).

    That makes the stream exact under the two things that break a single random generator:
    - distributed training: every rank draws the offsets of the global batch (batch_size * world_size) for
      batch i and keeps its own slice, so the ranks together train on exactly the batch one process with
      world_size times the batch size would see;
    - resuming: iteration starts at batch `start` (an int, or a callable asked each time iteration begins,
      e.g. the number of batches the trainer has consumed), so a run resumed from a checkpoint draws the
      batches an uninterrupted run would have drawn.
    With several DataLoader workers, worker w yields batches start + w, start + w + W, ..., which the
    DataLoader hands out in order.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int,
        start: int | Callable[[], int] = 0,
        rank: int = 0,
        world_size: int = 1,
        eos: int | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.tokens, self.block_size, self.batch_size, self.seed = tokens, block_size, batch_size, seed
        self.start, self.rank, self.world_size = start, rank, world_size
        self.eos = eos  # packing: batches are (x, targets, document ids) split at this token

    def first_batch(self) -> int:
        return self.start() if callable(self.start) else self.start

    def offsets(self, index: int) -> torch.Tensor:
        """Start offsets of this rank's rows of batch number `index`."""
        key = np.random.SeedSequence([self.seed, index]).generate_state(1, np.uint64)[0]
        generator = torch.Generator().manual_seed(int(key))
        high = len(self.tokens) - self.block_size  # last start whose window has block_size + 1 tokens, plus 1
        starts = torch.randint(high, (self.batch_size * self.world_size,), generator=generator)
        return starts[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        worker = get_worker_info()
        first, stride = self.first_batch(), 1
        if worker is not None:
            first, stride = first + worker.id, worker.num_workers
        for index in itertools.count(first, stride):
            x, y = window_batch(self.tokens, self.offsets(index), self.block_size)
            yield (x, y) if self.eos is None else document_targets(x, y, self.eos)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to a worker process: pin the start now rather than pickle the callable (and what it holds).
        return {**self.__dict__, "start": self.first_batch()}


class FixedBlocks(Dataset):
    """A fixed set of windows for evaluation: every non-overlapping block of the split (`count` None), or
    `count` windows at seeded random offsets. Fixed, so every validation measures the same text."""

    def __init__(self, tokens: np.ndarray, block_size: int, count: int | None, seed: int, eos: int | None = None):
        self.tokens, self.block_size, self.eos = tokens, block_size, eos
        if count is None:
            self.starts = torch.arange(0, len(tokens) - block_size, block_size)
        else:
            generator = torch.Generator().manual_seed(seed)
            self.starts = torch.randint(len(tokens) - block_size, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = window_batch(self.tokens, self.starts[index : index + 1], self.block_size)
        if self.eos is not None:
            return tuple(part[0] for part in document_targets(x, y, self.eos))
        return x[0], y[0]


class TextDataModule(SplitDataModule):
    """Language-modelling batches from text files.

    path: a file, a folder (all its files, recursively, sorted) or a glob pattern, or a list of them; the
    files are joined with an <eos> token between them. tokenizer: char | bpe (byte-level, trained to
    vocab_size). The tokenizer is fit on the whole corpus (a char vocabulary must cover the val split).
    eval_batches: evaluate on that many random batches of the val/test split, or null for all of it.
    packing: batches carry document ids, attention stays within documents and no target crosses a document end.
    document_split: where a document ends (an <eos> follows it): file | line | blank_line.
    special_tokens: tokens the trained tokenizer reserves besides <pad> <bos> <eos> <unk> (a masked language model:
    [MASK] [CLS] [SEP]); each is one token wherever it appears in a text.
    """

    def __init__(
        self,
        path: str | list[str] | None = None,
        tokenizer: str = "char",
        vocab_size: int | None = None,
        block_size: int = 64,
        batch_size: int = 12,
        eval_batch_size: int | None = None,
        eval_batches: int | None = 50,
        val_fraction: float = 0.1,
        test_fraction: float = 0.05,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        encoding: str = "utf-8",
        packing: bool = False,
        document_split: str = "file",
        special_tokens: list[str] | tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        if document_split not in DOCUMENT_SPLITS:
            raise DataError(f"unknown data.document_split {document_split!r}; valid choices: {list(DOCUMENT_SPLITS)}")
        if not isinstance(packing, bool):
            raise DataError(f"data.packing must be true or false, got {packing!r}")
        self.packing = packing
        self.document_split = document_split
        if tokenizer not in KINDS:
            raise DataError(f"unknown data.tokenizer {tokenizer!r}; valid choices: {list(KINDS)}")
        if tokenizer == "bpe" and vocab_size is None:
            raise DataError("data.vocab_size must be set for data.tokenizer=bpe (e.g. 512 or 50257)")
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise DataError(f"data.{name} must be a positive int, got {value!r}")
        if eval_batches is not None and (not isinstance(eval_batches, int) or eval_batches <= 0):
            raise DataError(f"data.eval_batches must be a positive int or null (the whole split), got {eval_batches!r}")
        if not 0.0 < val_fraction < 1.0 or not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
            raise DataError(
                f"data.val_fraction in (0, 1) and data.test_fraction in [0, 1) must leave a training split, "
                f"got val_fraction={val_fraction} and test_fraction={test_fraction}"
            )
        if isinstance(special_tokens, str) or not all(isinstance(t, str) and t for t in special_tokens):
            raise DataError(f"data.special_tokens must be a list of non-empty strings, got {special_tokens!r}")
        self.special_tokens = tuple(token for token in special_tokens if token not in SPECIAL_TOKENS)
        self.path = path
        self.tokenizer_kind = tokenizer
        self.requested_vocab_size = vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.eval_batches = eval_batches
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.cache_dir = cache_dir
        self.encoding = encoding
        self.tokenizer: Tokenizer | None = None
        self.given_tokenizer: Tokenizer | None = None  # a pretrained model's (use_tokenizer), else one is trained
        self.tokens: np.ndarray | None = None
        self.splits: dict[str, np.ndarray] = {}

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Tokenise the corpus with `tokenizer` (a pretrained model's) instead of training one: the text is
        read again if it was tokenised already."""
        if self.tokenizer is not None and tokenizer_to_string(tokenizer) == tokenizer_to_string(self.tokenizer):
            return
        self.given_tokenizer, self.tokenizer, self.tokens, self.splits = tokenizer, None, None, {}
        self.setup()

    # -- the corpus -------------------------------------------------------------------------------
    def sources(self) -> list[Path]:
        """The text files of the corpus, in order. Subclasses find or fetch their own."""
        entries = [self.path] if isinstance(self.path, (str, os.PathLike)) else list(self.path or [])
        if not entries or any(not str(entry).strip() for entry in entries):
            raise DataError(f"data.path must name text files, a folder or a glob pattern, got {self.path!r}")
        files: list[Path] = []
        for entry in entries:
            path = Path(entry).expanduser()
            if path.is_file():
                files.append(path)
            elif path.is_dir():
                found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
                if not found:
                    raise DataError(f"data.path folder {str(path)!r} holds no files")
                files.extend(found)
            else:
                found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
                if not found:
                    raise DataError(
                        f"data.path {str(entry)!r} is not a file, a folder or a glob pattern matching files"
                    )
                files.extend(found)
        return files

    def read_chunks(self, files: list[Path]) -> Iterator[tuple[int, str]]:
        """(file index, text chunk) pairs: each file in line-aligned chunks of about CHUNK_CHARS characters."""
        for index, path in enumerate(files):
            try:
                with open(path, encoding=self.encoding, newline="") as handle:
                    chunk: list[str] = []
                    size = 0
                    for line in handle:
                        chunk.append(line)
                        size += len(line)
                        # A paragraph never straddles two chunks: they are cut at blank lines only.
                        if size >= CHUNK_CHARS and (self.document_split != "blank_line" or not line.strip()):
                            yield index, "".join(chunk)
                            chunk, size = [], 0
                    if chunk:
                        yield index, "".join(chunk)
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{str(path)!r} is not {self.encoding} text (bad byte at offset {error.start}); "
                    f"set data.encoding (e.g. latin-1) or leave the file out of data.path"
                ) from None

    # -- tokenisation, once -----------------------------------------------------------------------
    def cache_key(self, files: list[Path]) -> str:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        description = [CACHE_VERSION, stats, self.tokenizer_kind, self.requested_vocab_size, self.encoding]
        if self.document_split != "file":  # the stream of earlier caches stays valid for file
            description.append(self.document_split)
        if self.special_tokens:  # likewise without extra special tokens
            description.append(list(self.special_tokens))
        if self.given_tokenizer is not None:
            description.append(hashlib.sha256(tokenizer_to_string(self.given_tokenizer).encode()).hexdigest())
        return hashlib.sha256(json.dumps(description).encode()).hexdigest()[:16]

    def tokenize(self, files: list[Path], out: Any) -> tuple[Tokenizer, int, int]:
        """Fit the tokenizer and write the token ids of all files to `out` (a binary file); returns the
        tokenizer, the number of tokens and the number of characters."""
        chars = 0

        def texts() -> Iterator[str]:
            nonlocal chars
            for _, text in self.read_chunks(files):
                chars += len(text)
                yield text

        if self.given_tokenizer is not None:
            tokenizer = self.given_tokenizer
            chars = sum(len(text) for _, text in self.read_chunks(files))
        else:
            tokenizer = train_tokenizer(
                self.tokenizer_kind,
                batched(texts(), 16),
                self.requested_vocab_size,
                special_tokens=SPECIAL_TOKENS + self.special_tokens,
            )
        if chars == 0:
            raise DataError(f"the text corpus is empty: {[str(p) for p in files][:5]}")
        dtype = token_dtype(tokenizer.get_vocab_size())
        eos = tokenizer.token_to_id(EOS)
        count = 0
        previous = 0
        for batch in batched(self.read_chunks(files), 16):
            if self.document_split != "file":  # every line or paragraph is a document and ends with <eos>
                documents = [document for _, text in batch for document in split_documents(text, self.document_split)]
                for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
                    ids = encoding.ids + ([eos] if eos is not None else [])
                    out.write(np.asarray(ids, dtype=dtype).tobytes())
                    count += len(ids)
                continue
            encodings = tokenizer.encode_batch([text for _, text in batch], add_special_tokens=False)
            for (index, _), encoding in zip(batch, encodings):
                if index != previous and eos is not None:  # a document boundary
                    out.write(np.array([eos], dtype=dtype).tobytes())
                    count += 1
                    previous = index
                out.write(np.asarray(encoding.ids, dtype=dtype).tobytes())
                count += len(encoding.ids)
        return tokenizer, count, chars

    def load_tokens(self, files: list[Path]) -> tuple[Tokenizer, np.ndarray]:
        """Token array and tokenizer: from `cache_dir` if this corpus was tokenised before, else made now."""
        if self.cache_dir is None:
            with tempfile.TemporaryFile() as out:
                tokenizer, count, chars = self.tokenize(files, out)
                out.seek(0)
                tokens = np.frombuffer(out.read(), dtype=token_dtype(tokenizer.get_vocab_size()))
            self._log_corpus(files, chars, count, tokenizer)
            return tokenizer, tokens
        folder = Path(self.cache_dir).expanduser() / f"{self.tokenizer_kind}-{self.cache_key(files)}"
        if not (folder / "meta.json").is_file():
            folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".staging-"))
            try:
                with open(staging / "tokens.bin", "wb") as out:
                    tokenizer, count, chars = self.tokenize(files, out)
                (staging / "tokenizer.json").write_text(tokenizer_to_string(tokenizer))
                meta = {"tokens": count, "chars": chars, "files": [str(p) for p in files]}
                (staging / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
                os.replace(staging, folder)  # atomic: concurrent runs never see half a cache
            except OSError:
                if not (folder / "meta.json").is_file():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        meta = json.loads((folder / "meta.json").read_text())
        tokenizer = tokenizer_from_string((folder / "tokenizer.json").read_text())
        dtype = token_dtype(tokenizer.get_vocab_size())
        tokens = np.memmap(folder / "tokens.bin", dtype=dtype, mode="r", shape=(meta["tokens"],))
        self._log_corpus(files, meta["chars"], meta["tokens"], tokenizer, folder)
        return tokenizer, tokens

    def _log_corpus(self, files: list[Path], chars: int, count: int, tokenizer: Tokenizer, cache: Path | None = None):
        where = f", cached in {cache}" if cache is not None else ""
        log.info(
            f"text corpus: {len(files)} file(s), {chars:,} characters -> {count:,} tokens "
            f"({self.tokenizer_kind} tokenizer, vocabulary {tokenizer.get_vocab_size()}){where}"
        )

    # -- Lightning --------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise RuntimeError("call setup() first: the vocabulary is known once the corpus is tokenised")
        return self.tokenizer.get_vocab_size()

    def setup(self, stage: str | None = None) -> None:
        if self.tokens is not None:
            return
        files = self.sources()
        self.tokenizer, self.tokens = self.load_tokens(files)
        total = len(self.tokens)
        train_end = int(total * (1.0 - self.val_fraction - self.test_fraction))
        val_end = int(total * (1.0 - self.test_fraction))
        self.splits = {"train": self.tokens[:train_end], "val": self.tokens[train_end:val_end]}
        if self.test_fraction > 0:
            self.splits["test"] = self.tokens[val_end:]
        for name, split in self.splits.items():
            if len(split) <= self.block_size:
                raise DataError(
                    f"the {name} split has {len(split)} tokens, too few for data.block_size={self.block_size} "
                    f"(the corpus has {total}); use a bigger corpus or a smaller block_size"
                )

    def loader(self, split: str) -> DataLoader:
        if split != "train":
            if split == "test" and "test" not in self.splits:
                log.warning("data.test_fraction=0: there is no test split, so the test stage measures the val split")
                split = "val"
            return self._eval_loader(split)
        trainer = self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        blocks = RandomBlocks(
            self.splits["train"], self.block_size, self.batch_size, self.seed, self.batches_consumed, rank, world_size,
            self.packing_eos(),
        )  # fmt: skip
        # Not persistent: workers are forked at each iter(), so a new epoch starts from the current batch count.
        return DataLoader(blocks, batch_size=None, num_workers=self.num_workers)

    def packing_eos(self) -> int | None:
        """The <eos> id that ends each document when packing (None: no packing)."""
        if not self.packing:
            return None
        eos = self.tokenizer.token_to_id(EOS)
        if eos is None:
            raise DataError(f"data.packing=true splits documents at {EOS}, which this tokenizer does not have")
        return eos

    def batches_consumed(self) -> int:
        """Training batches drawn so far (restored from the checkpoint on resume): where the stream goes on."""
        trainer = self.trainer
        return 0 if trainer is None else trainer.global_step * trainer.accumulate_grad_batches

    def _eval_loader(self, split: str) -> DataLoader:
        count = None if self.eval_batches is None else self.eval_batches * self.eval_batch_size
        blocks = FixedBlocks(self.splits[split], self.block_size, count, self.seed + 1, self.packing_eos())
        return DataLoader(blocks, batch_size=self.eval_batch_size, shuffle=False, num_workers=self.num_workers)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ShakespeareDataModule(TextDataModule):
    """tiny-shakespeare (Karpathy 2015; 1.1M characters): read from `path` when that file exists,
    otherwise downloaded once into data_dir."""

    url = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

    def __init__(self, path: str | None = None, data_dir: str = "data", download: bool = True, **kwargs: Any) -> None:
        super().__init__(path=path, **kwargs)
        self.data_dir = data_dir
        self.download = download

    def sources(self) -> list[Path]:
        if self.path and Path(self.path).expanduser().is_file():
            return [Path(self.path).expanduser()]
        target = Path(self.data_dir).expanduser() / "tinyshakespeare" / "input.txt"
        if not target.is_file():
            reason = "download disabled"
            if self.download:
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with urllib.request.urlopen(self.url, timeout=30) as response:
                        text = response.read()
                    partial = target.with_suffix(".part")
                    partial.write_bytes(text)
                    os.replace(partial, target)
                    log.info(f"downloaded tiny-shakespeare to {target}")
                except Exception as error:  # offline, proxy, disk: all end in the same advice
                    reason = f"download failed: {type(error).__name__}"
            if not target.is_file():
                raise DataError(
                    f"tiny-shakespeare: data.path={self.path!r} is not a file and {target} is missing ({reason}); "
                    f"set data.path to a copy of input.txt"
                )
        return [target]


# Pure-Python standard-library modules (about 0.9 MB of source): well-written, varied, always present.
STDLIB_MODULES = (
    "argparse", "collections", "dataclasses", "enum", "functools", "inspect", "json", "logging",
    "pathlib", "subprocess", "textwrap", "threading", "typing",
)  # fmt: skip


class PythonStdlibDataModule(TextDataModule):
    """The source code of Python standard-library modules, read from the running interpreter: an
    embedded corpus that needs no download (it follows the interpreter's version)."""

    def __init__(self, modules: list[str] | tuple[str, ...] = STDLIB_MODULES, **kwargs: Any) -> None:
        super().__init__(path=None, **kwargs)
        self.modules = list(modules)

    def sources(self) -> list[Path]:
        if not self.modules:
            raise DataError("data.modules must list standard-library modules, e.g. [argparse, json, typing]")
        files = []
        for name in self.modules:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            origin = getattr(spec, "origin", None)
            if origin is None or not origin.endswith(".py") or not Path(origin).is_file():
                raise DataError(
                    f"data.modules: {name!r} is not a pure-Python module of this interpreter; "
                    f"valid examples: {list(STDLIB_MODULES)}"
                )
            files.append(Path(origin))
        return files
