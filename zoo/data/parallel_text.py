"""Parallel corpora for translation: your own files, Multi30k, and an embedded corpus of numbers.

Every module reads sentence pairs, trains one joint BPE vocabulary on both sides of the training
split (Sennrich et al. 2016; stored in the checkpoint by the task), and yields length-bucketed batches
whose padded size stays under `max_tokens`, so short sentences travel in large batches and padding
stays small. Batches are dicts: src (B, S) ids ending in EOS, tgt (B, T) ids framed by BOS/EOS,
src_text / tgt_text the raw strings (references for detokenized BLEU).
"""

from __future__ import annotations

import gzip
import random
import urllib.request
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Sampler

from zoo.data.splits import SplitDataModule
from zoo.data.tokenizers import BOS, EOS, PAD, batched, train_bpe_tokenizer
from zoo.errors import DataError

SPLITS = ("train", "val", "test")
Pairs = tuple[list[str], list[str]]


# -- reading ---------------------------------------------------------------------------------------
def read_lines(path: str | Path, key: str) -> list[str]:
    """Lines of a plain or gzipped UTF-8 text file (newline removed); `key` names the config entry."""
    path = Path(path).expanduser()
    if not str(path) or not path.is_file():
        raise DataError(f"{key}: file not found: {str(path)!r}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            lines = [line.rstrip("\r\n") for line in handle]
    except (UnicodeDecodeError, OSError, EOFError) as error:
        raise DataError(
            f"{key}: {str(path)!r} is not readable UTF-8 text ({type(error).__name__}); save it as utf-8 (plain or .gz)"
        ) from None
    if not lines:
        raise DataError(f"{key}: file is empty: {str(path)!r}")
    return lines


def read_parallel(spec: Any, key: str) -> Pairs:
    """A split given as one TSV file (source<TAB>target per line) or two aligned files [source, target]."""
    if isinstance(spec, str) and spec:
        source, target = [], []
        for number, line in enumerate(read_lines(spec, key), start=1):
            columns = line.split("\t")
            if len(columns) != 2:
                raise DataError(
                    f"{key}: line {number} of {spec!r} has {len(columns)} tab-separated columns, expected 2"
                )
            source.append(columns[0])
            target.append(columns[1])
        return source, target
    if isinstance(spec, (list, tuple)) and len(spec) == 2 and all(isinstance(p, str) and p for p in spec):
        source, target = read_lines(spec[0], key), read_lines(spec[1], key)
        if len(source) != len(target):
            raise DataError(
                f"{key}: {spec[0]!r} has {len(source)} lines but {spec[1]!r} has {len(target)}; "
                "parallel files must align line by line"
            )
        return source, target
    raise DataError(f"{key} must be a TSV path or a list of two paths [source, target], got {spec!r}")


def parse_direction(direction: str, languages: tuple[str, ...], key: str = "data.direction") -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), both among `languages` and different."""
    parts = direction.split("-") if isinstance(direction, str) else []
    if len(parts) != 2 or parts[0] == parts[1] or not set(parts) <= set(languages):
        raise DataError(
            f"{key} must be <source>-<target> with two different languages of {sorted(languages)}, got {direction!r}"
        )
    return parts[0], parts[1]


# -- batching --------------------------------------------------------------------------------------
class TokenBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches: indices sorted by length (random tie-break when shuffling) are cut into
    batches of at most `max_tokens` padded tokens (rows x longest sequence); batch order is shuffled
    every epoch, reproducibly from `seed`."""

    def __init__(self, lengths: list[int], max_tokens: int, shuffle: bool = False, seed: int = 0) -> None:
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise DataError(f"data.max_tokens must be a positive int, got {max_tokens!r}")
        if lengths and max(lengths) > max_tokens:
            raise DataError(f"data.max_tokens={max_tokens} is shorter than the longest sequence ({max(lengths)})")
        self.lengths = lengths
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def _batches(self, rng: random.Random | None) -> list[list[int]]:
        noise = [rng.random() for _ in self.lengths] if rng else [0.0] * len(self.lengths)
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], noise[i]))
        batches, batch, longest = [], [], 0
        for index in order:
            longest_if_added = max(longest, self.lengths[index])
            if batch and (len(batch) + 1) * longest_if_added > self.max_tokens:
                batches.append(batch)
                batch, longest_if_added = [], self.lengths[index]
            batch.append(index)
            longest = longest_if_added
        if batch:
            batches.append(batch)
        if rng:
            rng.shuffle(batches)
        return batches

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch) if self.shuffle else None
        self.epoch += 1
        return iter(self._batches(rng))

    def __len__(self) -> int:
        return len(self._batches(None))  # the cut depends on the sorted lengths only, not on the tie-break


def pad_sequences(sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        out[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    return out


def encode_sources(tokenizer: Tokenizer, texts: list[str], max_length: int | None = None) -> list[list[int]]:
    """Source ids end in EOS (as in fairseq); truncated to max_length tokens."""
    eos = tokenizer.token_to_id(EOS)
    encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [(ids[: max_length - 1] if max_length else ids) + [eos] for ids in encoded]


def encode_targets(tokenizer: Tokenizer, texts: list[str], max_length: int | None = None) -> list[list[int]]:
    """Target ids framed as BOS ... EOS: decoder input [:-1], labels [1:]."""
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [[bos] + (ids[: max_length - 2] if max_length else ids) + [eos] for ids in encoded]


def decode_ids(tokenizer: Tokenizer, ids: list[int]) -> str:
    """Detokenized text (the prefix space of byte-level BPE removed)."""
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


class PairDataset(torch.utils.data.Dataset):
    def __init__(
        self, source: list[list[int]], target: list[list[int]], source_text: list[str], target_text: list[str]
    ) -> None:
        self.source, self.target, self.source_text, self.target_text = source, target, source_text, target_text

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[list[int], list[int], str, str]:
        return self.source[index], self.target[index], self.source_text[index], self.target_text[index]

    def lengths(self) -> list[int]:
        return [max(len(s), len(t)) for s, t in zip(self.source, self.target)]


# -- the data modules ------------------------------------------------------------------------------
class TranslationDataModule(SplitDataModule):
    """Base: subclasses implement `load()` -> {"train" | "val" | "test": (source lines, target lines)}.

    vocab_size: joint BPE size; max_tokens: padded tokens per training batch (eval_max_tokens for
    val/test); max_length: training pairs longer than this (in tokens) are dropped, others truncated.
    """

    def __init__(
        self,
        vocab_size: int = 8000,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        max_length: int = 256,
        min_frequency: int = 2,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(max_length, int) or max_length < 3:
            raise DataError(f"data.max_length must be an int >= 3, got {max_length!r}")
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.max_length = max_length
        self.min_frequency = min_frequency
        self.num_workers = num_workers
        self.seed = seed
        self.texts: dict[str, Pairs] | None = None
        self.tokenizer: Tokenizer | None = None
        self._datasets: dict[str, PairDataset] = {}

    def load(self) -> dict[str, Pairs]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.texts is None:
            self.texts = self.load()
            for split in SPLITS:
                if split not in self.texts or not self.texts[split][0]:
                    raise DataError(f"{type(self).__name__} has no {split} pairs")
        if self.tokenizer is None:
            source, target = self.texts["train"]
            self.tokenizer = train_bpe_tokenizer(
                batched(source + target), self.vocab_size, min_frequency=self.min_frequency, add_prefix_space=True
            )

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Use this (e.g. a checkpoint's) tokenizer from now on instead of the one trained in setup."""
        self.tokenizer = tokenizer
        self._datasets.clear()

    def dataset(self, split: str) -> PairDataset:
        if split not in self._datasets:
            if self.texts is None or self.tokenizer is None:
                self.setup()
            source_text, target_text = self.texts[split]
            source = encode_sources(self.tokenizer, source_text, self.max_length)
            target = encode_targets(self.tokenizer, target_text, self.max_length)
            if split == "train":  # drop what would be truncated: a cut sentence is a wrong translation
                raw_source = encode_sources(self.tokenizer, source_text)
                raw_target = encode_targets(self.tokenizer, target_text)
                keep = [
                    i
                    for i in range(len(source))
                    if len(raw_source[i]) <= self.max_length and len(raw_target[i]) <= self.max_length
                ]
                pick = lambda items: [items[i] for i in keep]
                source, target, source_text, target_text = map(pick, (source, target, source_text, target_text))
            self._datasets[split] = PairDataset(source, target, source_text, target_text)
        return self._datasets[split]

    def collate(self, items: list[tuple[list[int], list[int], str, str]]) -> dict[str, Any]:
        pad = self.tokenizer.token_to_id(PAD)
        source, target, source_text, target_text = zip(*items)
        return {
            "src": pad_sequences(list(source), pad),
            "tgt": pad_sequences(list(target), pad),
            "src_text": list(source_text),
            "tgt_text": list(target_text),
        }

    def loader(self, split: str) -> DataLoader:
        dataset = self.dataset(split)
        train = split == "train"
        sampler = TokenBatchSampler(
            dataset.lengths(), self.max_tokens if train else self.eval_max_tokens, shuffle=train, seed=self.seed
        )
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


class ParallelTextDataModule(TranslationDataModule):
    """Your own corpus: each of train / val / test is a TSV file (source<TAB>target) or a list of two
    line-aligned files [source, target]; plain or .gz."""

    def __init__(self, train: Any = None, val: Any = None, test: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.files = {"train": train, "val": val, "test": test}

    def load(self) -> dict[str, Pairs]:
        return {split: read_parallel(spec, f"data.{split}") for split, spec in self.files.items()}


class Multi30kDataModule(TranslationDataModule):
    """Multi30k task 1 (Elliott et al. 2016): 29,000 / 1,014 / 1,000 (test_2016_flickr) image captions.

    Reads `data_dir` holding {train,val,test_2016_flickr}.{lang}.gz; downloads the missing files from
    the dataset's GitHub repository when online.
    """

    languages = ("cs", "de", "en", "fr")
    files = {"train": "train", "val": "val", "test": "test_2016_flickr"}
    url = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"

    def __init__(
        self, data_dir: str | None = None, direction: str = "de-en", download: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.source_lang, self.target_lang = parse_direction(direction, self.languages)
        self.data_dir = data_dir
        self.download = download

    def _file(self, split: str, lang: str) -> Path:
        root = Path(self.data_dir or "data/multi30k").expanduser()
        path = root / f"{self.files[split]}.{lang}.gz"
        if not path.is_file() and self.download:
            try:
                root.mkdir(parents=True, exist_ok=True)
                urllib.request.urlretrieve(self.url.format(name=path.name), path)
            except Exception as error:  # offline, proxy, read-only folder: the same advice
                path.unlink(missing_ok=True)
                raise DataError(
                    f"Multi30k file {path.name} is not in data.data_dir={str(root)!r} and could not be downloaded "
                    f"({type(error).__name__}); point data.data_dir at a folder holding the .gz files"
                ) from None
        return path

    def load(self) -> dict[str, Pairs]:
        return {
            split: read_parallel(
                [str(self._file(split, self.source_lang)), str(self._file(split, self.target_lang))],
                f"data.data_dir ({split})",
            )
            for split in SPLITS
        }


class NumbersDataModule(TranslationDataModule):
    """The embedded corpus: integers written out by num2words in German and English
    ("vierundzwanzigtausendeinhundertdrei" -> "twenty-four thousand, one hundred and three").

    German writes a number as one compound with units before tens, so the model has to segment the
    word and reorder its parts. Numbers are drawn with a uniformly random count of digits (1..max_digits),
    distinct across the splits; no download, the same corpus on every machine for a given seed.
    """

    languages = ("de", "en")

    def __init__(
        self,
        num_train: int = 20000,
        num_val: int = 500,
        num_test: int = 500,
        max_digits: int = 6,
        direction: str = "de-en",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.source_lang, self.target_lang = parse_direction(direction, self.languages)
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            if not isinstance(value, int) or value <= 0:
                raise DataError(f"data.{name} must be a positive int, got {value!r}")
        if not isinstance(max_digits, int) or not 1 <= max_digits <= 9:
            raise DataError(f"data.max_digits must be an int in [1, 9], got {max_digits!r}")
        total = num_train + num_val + num_test
        if total > 10**max_digits:
            raise DataError(f"data.max_digits={max_digits} allows only {10**max_digits} numbers, {total} requested")
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.max_digits = max_digits

    def sample_numbers(self) -> list[int]:
        rng = random.Random(self.seed)
        total = sum(self.sizes.values())
        # Short numbers run out first (there are only 10 one-digit ones): then longer ones fill in.
        numbers: set[int] = set()
        while len(numbers) < total:
            digits = rng.randint(1, self.max_digits)
            numbers.add(rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits))
        ordered = sorted(numbers)
        rng.shuffle(ordered)
        return ordered

    def load(self) -> dict[str, Pairs]:
        from num2words import num2words

        numbers = self.sample_numbers()
        splits, start = {}, 0
        for split in SPLITS:
            chunk = numbers[start : start + self.sizes[split]]
            start += self.sizes[split]
            source = [num2words(n, lang=self.source_lang) for n in chunk]
            target = [num2words(n, lang=self.target_lang) for n in chunk]
            splits[split] = (source, target)
        return splits
