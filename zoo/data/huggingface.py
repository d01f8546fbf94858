"""Hugging Face datasets read from disk, offline: `data=hf_text | hf_images | hf_captions | hf_parallel_text |
hf_sequences`.

`data.path` is a folder written by `datasets`' `save_to_disk` (a Dataset or a DatasetDict), or local .parquet /
.arrow files (a file, a folder of them, or a glob pattern), read through the `datasets` library (pip install
'.[hf]'). Nothing is downloaded: a hub name is one line saying how to save it to a folder where there is network.
Columns are options (data.text_column, ...); a missing one is one line naming the valid columns. Splits: train,
and validation (or val, valid, dev) and test where the dataset has them; missing ones are drawn from train, seeded.
Each family's module is its file-reading module with only the reading replaced, so batches, tokenizers and
options (packing for text, augmentation for images) are those of data=text, image_folder, image_captions and
parallel_text; hf_sequences is a TokenSequenceDataModule as data=listops (packing included).
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from zoo.data.captions import CaptionFileDataModule
from zoo.data.images import ImageClassificationDataModule
from zoo.data.parallel_text import Pairs, TranslationDataModule
from zoo.data.sequences import TokenSequenceDataModule
from zoo.data.text import TextDataModule
from zoo.errors import DataError

SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}


def load_local_dataset(path: str | Path, key: str = "data.path") -> dict[str, Any]:
    """{split name: datasets.Dataset} of a save_to_disk folder or of local parquet / arrow files."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "data=hf_* reads Hugging Face datasets with the `datasets` library: pip install '.[hf]'"
        ) from None
    folder = Path(str(path)).expanduser()
    if folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()):
        loaded = datasets.load_from_disk(str(folder))
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if folder.is_file():
        files = [folder]
    elif folder.is_dir():
        files = sorted(p for p in folder.rglob("*") if p.suffix in (".parquet", ".arrow"))
    else:
        files = sorted(Path(p) for p in glob.glob(str(folder), recursive=True) if Path(p).is_file())
    if not files:
        if not folder.exists() and not glob.has_magic(str(path)):
            raise DataError(
                f"{key}={str(path)!r} is not a local folder or file, and Hugging Face datasets are read offline here: "
                f"where there is network, run datasets.load_dataset({str(path)!r}).save_to_disk('<folder>') and pass "
                f"{key}=<folder> (a folder of .parquet or .arrow files works too)"
            )
        raise DataError(f"{key}={str(path)!r} holds no dataset: a save_to_disk folder or .parquet / .arrow files")
    splits: dict[str, list[Path]] = {}
    for file in files:  # a file belongs to the split its name (or folder) names, else to train
        names = [part.lower() for part in (*file.parent.parts[-1:], file.stem)]
        split = next((s for s, aliases in SPLIT_NAMES.items() if any(n.startswith(aliases) for n in names)), "train")
        splits.setdefault(split, []).append(file)
    return {split: _read_files(datasets, group) for split, group in splits.items()}


def _read_files(datasets: Any, files: list[Path]) -> Any:
    """One in-memory Dataset of parquet or arrow files (their features, e.g. Image, from the schema metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for file in files:
        try:
            if file.suffix == ".parquet":
                tables.append(pq.read_table(file))
            else:
                tables.append(datasets.Dataset.from_file(str(file)).data.table)
        except (OSError, pa.ArrowException) as error:
            raise DataError(f"cannot read {file} as {file.suffix[1:]} ({type(error).__name__}: {error})") from None
    return datasets.Dataset(pa.concat_tables(tables))


def check_columns(dataset: Any, columns: dict[str, str], path: Any) -> None:
    """A one-line DataError for the first option (data.<key>) naming a column the dataset lacks."""
    for key, column in columns.items():
        if column.split(".", 1)[0] not in dataset.column_names:
            raise DataError(f"data.{key}={column!r} is not a column of {path}; valid columns: {dataset.column_names}")


def held(value: Any) -> str:
    """What a column holds, in words, from one of its values: "strings (e.g. 'imgs/0.png')", "ints (e.g. 3)"."""
    if isinstance(value, dict):
        return f"dicts with keys {sorted(value)}"
    if hasattr(value, "size") and hasattr(value, "mode"):
        return "images"
    example = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    kind = {str: "strings", bool: "booleans", int: "ints", float: "floats", list: "lists"}.get(type(value))
    return f"{kind or type(value).__name__ + ' values'} (e.g. {example})"


def first_value(dataset: Any, column: str) -> Any:
    """The first row's value of a column (`translation.de`: the column's dict); None for an empty dataset."""
    return dataset[0][column.split(".", 1)[0]] if len(dataset) else None


def check_column_kind(dataset: Any, key: str, column: str, expected: str, path: Any) -> None:
    """A one-line DataError when data.<key>'s column does not hold `expected` ("images", "token sequences",
    "text"), judged by its first value; `translation.de` must name a key of a column of dicts."""
    value = first_value(dataset, column)
    if value is None:
        return
    name, _, field = column.partition(".")
    if field:
        if not isinstance(value, dict) or field not in value:
            fields = ", ".join(f"{name}.{k}" for k in sorted(value)) if isinstance(value, dict) else "none"
            raise DataError(f"data.{key}={column!r}: column {name!r} of {path} holds {held(value)}, with no key "
                            f"{field!r}; valid: {fields}")  # fmt: skip
        value = value[field]
    from PIL import Image

    ids = isinstance(value, list | np.ndarray) and all(
        isinstance(token, int | np.integer) and not isinstance(token, bool) for token in value
    )
    fits = {
        "images": isinstance(value, Image.Image | list | np.ndarray),
        "token sequences": isinstance(value, str) or ids,
        "text": isinstance(value, str),
    }[expected]
    if fits:
        return
    hint = ""
    if expected == "images" and isinstance(value, str):
        hint = " (file paths: cast the column with datasets.Image() before save_to_disk)"
    elif expected == "token sequences":
        hint = " (lists of token ids, or strings)"
    elif expected == "text" and isinstance(value, dict):
        hint = "; name a key: " + ", ".join(f"{column}.{k}" for k in sorted(value))
    raise DataError(f"data.{key}={column!r} of {path} holds {held(value)}, not {expected}{hint}")


def column_values(dataset: Any, column: str) -> list:
    """A column's values; `translation.de` reads key `de` of a column of dicts (the WMT datasets' layout)."""
    name, _, field = column.partition(".")
    values = dataset[name]
    return [value[field] for value in values] if field else list(values)


def three_splits(splits: dict[str, Any], val_fraction: float, test_fraction: float, seed: int) -> dict[str, Any]:
    """train / val / test Datasets: the dataset's own where it has them, else drawn from train (seeded)."""
    named = {split: next((splits[n] for n in aliases if n in splits), None) for split, aliases in SPLIT_NAMES.items()}
    named["train"] = named["train"] if named["train"] is not None else next(iter(splits.values()))
    for split, fraction in (("test", test_fraction), ("val", val_fraction)):
        if named[split] is None:
            parts = named["train"].train_test_split(test_size=fraction, seed=seed)
            named["train"], named[split] = parts["train"], parts["test"]
    return named


def class_names(named: dict[str, Any], column: str) -> tuple[list[str], Any]:
    """(class names, label -> class index) of a label column: a ClassLabel's names (its ints are the indices), or
    the sorted distinct values of train and test (ints or strings)."""
    names = getattr(named["train"].features[column], "names", None)
    if names is not None:
        return [str(name) for name in names], int
    names = sorted({str(label) for split in ("train", "test") for label in named[split][column]})
    index = {name: i for i, name in enumerate(names)}
    return names, lambda label: index[str(label)]


def image_tensor(image: Any, channels: int, size: int) -> torch.Tensor:
    """A PIL image or an array -> uint8 (channels, size, size)."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image, dtype=np.uint8))
    array = np.asarray(image.convert("RGB" if channels == 3 else "L"), dtype=np.uint8)
    tensor = torch.from_numpy(array.copy()).reshape(array.shape[0], array.shape[1], channels).permute(2, 0, 1)
    return v2.functional.resize(tensor, [size, size], antialias=True)


class HFTextDataModule(TextDataModule):
    """data=hf_text: the rows of `text_column` (of split `split`) are the documents of a data=text corpus (an
    <eos> between rows, so data.packing keeps rows apart); tokenizer, blocks and options as data=text."""

    def __init__(self, path: str | None = None, text_column: str = "text", split: str = "train", **kwargs: Any):
        super().__init__(path=path, **kwargs)
        self.text_column, self.split = text_column, split

    def sources(self) -> list[Path]:
        if not self.path:
            raise DataError("data.path must name a save_to_disk folder or parquet / arrow files, got nothing")
        splits = load_local_dataset(self.path)
        if self.split not in splits:
            raise DataError(f"data.split={self.split!r} is not a split of {self.path}; valid splits: {sorted(splits)}")
        check_columns(splits[self.split], {"text_column": self.text_column}, self.path)
        self.rows = column_values(splits[self.split], self.text_column)
        return [Path(str(self.path)).expanduser()]

    def cache_key(self, files: list[Path]) -> str:
        return f"{super().cache_key(files)}-{self.split}-{self.text_column}"

    def read_chunks(self, files: list[Path]):
        for index, text in enumerate(self.rows):  # a row ends with a newline, as a line of a text file does
            text = str(text)
            yield index, text if text.endswith("\n") else text + "\n"


class HFImageDataModule(ImageClassificationDataModule):
    """data=hf_images: labelled images (`image_column`: Image feature or arrays; `label_column`: ints, a ClassLabel
    whose names become the class names, or strings) resized to image_size; test: the dataset's test (or validation)
    split, else a seeded 20% of train."""

    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

    def __init__(self, path: str | None = None, image_column: str = "image", label_column: str = "label", **kwargs):
        super().__init__(**kwargs)
        self.path, self.image_column, self.label_column = path, image_column, label_column
        if (self.in_channels or 3) == 1:
            self.mean, self.std = (0.5,), (0.5,)

    def augmentations(self) -> list:
        return [v2.RandomHorizontalFlip()]

    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.image_size is None:
            raise DataError("data.image_size must be set for hf_images (images are resized to it)")
        splits = load_local_dataset(self.path)
        columns = {"image_column": self.image_column, "label_column": self.label_column}
        for dataset in splits.values():
            check_columns(dataset, columns, self.path)
            check_column_kind(dataset, "image_column", self.image_column, "images", self.path)
        named = three_splits(splits, 0.1, 0.2, self.seed)
        names, class_index = class_names(named, self.label_column)
        channels = self.in_channels or 3

        def read(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
            images = torch.stack(
                [image_tensor(image, channels, self.image_size) for image in dataset[self.image_column]]
            )
            labels = [class_index(label) for label in dataset[self.label_column]]
            return images, torch.tensor(labels, dtype=torch.long)

        train = [named["train"], named["val"]]  # the module draws its own validation split from train
        import datasets

        train_images, train_labels = read(datasets.concatenate_datasets(train))
        test_images, test_labels = read(named["test"])
        if self.num_classes is not None and self.num_classes != len(names):
            raise DataError(f"data.num_classes={self.num_classes}, but {self.path} has {len(names)} classes {names}")
        self.classes = tuple(str(name) for name in names)
        return train_images, train_labels, test_images, test_labels


class HFCaptionDataset(Dataset):
    """(image, caption, image index, -1) samples of rows of a Dataset; images decoded and transformed on access."""

    def __init__(self, dataset: Any, columns: tuple[str, str], transform: Any, channels: int, size: int) -> None:
        self.dataset, self.columns, self.transform, self.channels, self.size = (
            dataset,
            columns,
            transform,
            channels,
            size,
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, int, int]:
        row = self.dataset[index]
        image = image_tensor(row[self.columns[0]], self.channels, self.size)
        return self.transform(image), str(row[self.columns[1]]), index, -1


class HFCaptionDataModule(CaptionFileDataModule):
    """data=hf_captions: image-caption rows (`image_column`, `caption_column`); each row its own match id;
    options as data=image_captions."""

    def __init__(self, path: str | None = None, image_column: str = "image", caption_column: str = "caption", **kwargs):
        super().__init__(pairs_file=str(path or ""), image_key=image_column, caption_key=caption_column, **kwargs)
        self.path = path

    def build_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        splits = load_local_dataset(self.path)
        columns = (self.image_key, self.caption_key)
        for dataset in splits.values():
            check_columns(dataset, {"image_column": columns[0], "caption_column": columns[1]}, self.path)
            check_column_kind(dataset, "image_column", columns[0], "images", self.path)
        named = three_splits(splits, self.val_fraction, self.test_fraction, self.seed)
        self.train_captions = [str(caption) for caption in named["train"][self.caption_key]]
        to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        size = (self.image_size, self.image_size)
        crop = [v2.RandomResizedCrop(size, scale=(0.8, 1.0), antialias=True)] if self.augment else []
        train_tf, eval_tf = v2.Compose([*crop, *to_float]), v2.Compose(to_float)
        return tuple(
            HFCaptionDataset(named[split], columns, train_tf if split == "train" else eval_tf, self.in_channels,
                             self.image_size)
            for split in ("train", "val", "test")
        )  # fmt: skip


class HFParallelTextDataModule(TranslationDataModule):
    """data=hf_parallel_text: sentence pairs from `source_column` and `target_column` (`translation.de` reads key
    de of a column of dicts, as the WMT datasets store them); options as data=parallel_text."""

    def __init__(
        self,
        path: str | None = None,
        source_column: str = "source",
        target_column: str = "target",
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.path, self.source_column, self.target_column = path, source_column, target_column
        self.val_fraction, self.test_fraction = val_fraction, test_fraction

    def load(self) -> dict[str, Pairs]:
        splits = load_local_dataset(self.path)
        columns = {"source_column": self.source_column, "target_column": self.target_column}
        for dataset in splits.values():
            check_columns(dataset, columns, self.path)
            for key, column in columns.items():
                check_column_kind(dataset, key, column, "text", self.path)
        named = three_splits(splits, self.val_fraction, self.test_fraction, self.seed)
        return {
            split: ([str(s) for s in column_values(data, self.source_column)],
                    [str(t) for t in column_values(data, self.target_column)])
            for split, data in named.items()
        }  # fmt: skip


class HFSequenceDataModule(TokenSequenceDataModule):
    """data=hf_sequences: token-sequence classification rows. `sequence_column` holds lists of token ids, or strings
    read as their UTF-8 bytes shifted by one (ids 1-256, 0 free for padding: Long Range Arena's byte-level Text
    task); sequences are cut to max_length and padded at the end with padding_id. `label_column` as hf_images'
    (ClassLabel, ints or strings). Splits: the dataset's, else drawn from train (seeded)."""

    def __init__(
        self,
        path: str | None = None,
        sequence_column: str = "tokens",
        label_column: str = "label",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.path, self.sequence_column, self.label_column = path, sequence_column, label_column
        self.val_fraction, self.test_fraction, self.seed = val_fraction, test_fraction, seed
        self.classes: tuple[str, ...] = ()

    def encode(self, sequence: Any, row: int) -> list[int]:
        """One row's token ids (a string: its bytes + 1), cut to max_length and padded with padding_id."""
        ids = [byte + 1 for byte in sequence.encode("utf-8")] if isinstance(sequence, str) else list(sequence)
        if isinstance(sequence, str) and self.padding_id not in (0, None):
            raise DataError(f"{self.sequence_column} holds text, read as bytes + 1 with 0 as padding: "
                            f"data.padding_id must be 0, got {self.padding_id}")  # fmt: skip
        ids = ids[: self.max_length]
        if len(ids) < self.max_length:
            if self.padding_id is None:
                raise DataError(f"row {row} of {self.path} has {len(ids)} tokens, fewer than data.max_length="
                                f"{self.max_length}, and data.padding_id is null; set data.padding_id")  # fmt: skip
            ids += [self.padding_id] * (self.max_length - len(ids))
        return ids

    def build_splits(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        splits = load_local_dataset(self.path)
        columns = {"sequence_column": self.sequence_column, "label_column": self.label_column}
        for dataset in splits.values():
            check_columns(dataset, columns, self.path)
            check_column_kind(dataset, "sequence_column", self.sequence_column, "token sequences", self.path)
        named = three_splits(splits, self.val_fraction, self.test_fraction, self.seed)
        names, class_index = class_names(named, self.label_column)
        if self.num_classes != len(names):
            raise DataError(f"data.num_classes={self.num_classes}, but {self.path} has {len(names)} classes {names}")
        self.classes = tuple(names)
        return {
            split: (
                torch.tensor([self.encode(seq, row) for row, seq in enumerate(data[self.sequence_column])],
                             dtype=torch.long).reshape(len(data), self.max_length),
                torch.tensor([class_index(label) for label in data[self.label_column]], dtype=torch.long),
            )
            for split, data in named.items()
        }  # fmt: skip
