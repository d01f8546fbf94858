"""Sharded, streamed datasets (litdata): the conversion of zoo's data into shards, and the data modules that read them.

Why litdata (docs/data-at-scale.md, figures in experiments/results/data_at_scale.md): Lightning's own format,
whose `StreamingDataset` deals chunks to ranks and DataLoader workers by itself and whose `StreamingDataLoader`
has a `state_dict`, which Lightning stores in every checkpoint, so a run resumes mid-epoch where it stopped.

A shards folder holds one litdata dataset per split (train/, val/, test/) and `zoo.json` (written last: a folder
without it is an unfinished conversion): the kind of data, what the model needs to know of it (classes, image size,
the tokenizer), and each chunk's size and CRC-32, so a truncated or corrupt shard is named before training reads it.

Kinds, by the data module the conversion reads (any of the kind: `data=image_folder`, `data=digits`, ...):
    images          ImageClassificationDataModule  {index, image uint8 (C, H, W), label}
    captions        CaptionDataModule              {index, image uint8 (C, H, W), caption, match_id, label}
    tokens          TextDataModule                 the token stream, one item per document chunk (TokensLoader)
    parallel_text   TranslationDataModule          {index, src ids, tgt ids, src_text, tgt_text}
    sequences       TokenSequenceDataModule        {index, tokens (max_length,) as written, label}
Images are stored as the evaluation transform's input (resized uint8); normalisation runs on each batch.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.data.captions import CaptionDataModule, encode_captions, prepare_caption_tokenizer
from zoo.data.images import ImageClassificationDataModule, RandomCropFlip
from zoo.data.parallel_text import TranslationDataModule, pad_sequences
from zoo.data.preprocessing import ImagePreprocessing
from zoo.data.sequences import TokenSequenceDataModule, collate_tokens, pack_sequences
from zoo.data.splits import SplitDataModule
from zoo.data.text import TextDataModule
from zoo.data.tokenizers import PAD, tokenizer_from_string, tokenizer_to_string
from zoo.errors import DataError

log = logging.getLogger("zoo")

KINDS = ("images", "captions", "tokens", "parallel_text", "sequences")
SPLITS = ("train", "val", "test")
META = "zoo.json"
FORMAT_VERSION = 1
TOKENS_PER_ITEM = 1 << 16  # the token stream is cut into items of this many tokens (TokensLoader joins them again)


# -- conversion -------------------------------------------------------------------------------------------
def kind_of(datamodule: Any) -> str:
    """Which kind of shards a data module converts to; one DataError naming the valid modules otherwise."""
    for kind, base in (
        ("images", ImageClassificationDataModule),
        ("captions", CaptionDataModule),
        ("tokens", TextDataModule),
        ("parallel_text", TranslationDataModule),
        ("sequences", TokenSequenceDataModule),
    ):
        if isinstance(datamodule, base):
            return kind
    raise DataError(
        f"mode=shard converts image classification, image-caption, text, parallel-text and token-sequence data, got "
        f"{type(datamodule).__name__}; valid data modules: ImageClassificationDataModule, CaptionDataModule, "
        "TextDataModule, TranslationDataModule, TokenSequenceDataModule (e.g. data=image_folder, image_captions, "
        "text, parallel_text, listops)"
    )


def check_output_folder(out: str | Path) -> Path:
    """The folder shards are written to: new or empty, never overwritten."""
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"out={str(out)!r} exists and is not empty; name a new folder (nothing was overwritten)")
    return out


def _image_item(images: torch.Tensor, labels: torch.Tensor, index: int) -> dict[str, Any]:
    return {"index": index, "image": images[index].numpy(), "label": int(labels[index])}


def _caption_item(dataset: Any, size: int, channels: int, index: int) -> dict[str, Any]:
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms import v2

    if hasattr(dataset, "rows"):  # a captions file: the image file, decoded and resized here
        path, caption, match_id = dataset.rows[index]
        mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
        image = v2.Resize((size, size), antialias=True)(decode_image(str(path), mode=mode))
        label = -1
    else:  # captions written from class names: the labelled image's uint8 pixels, the evaluation template
        images = dataset.images
        image, label = images.images[index], int(images.labels[index])
        caption, match_id = (
            dataset.templates[index % len(dataset.templates)].format(label=dataset.classes[label]),
            label,
        )
        if tuple(image.shape[-2:]) != (size, size):
            image = v2.Resize((size, size), antialias=True)(image)
    return {"index": index, "image": image.numpy(), "caption": caption, "match_id": match_id, "label": label}


def _token_item(tokens: np.ndarray, index: int) -> torch.Tensor:
    return torch.from_numpy(np.asarray(tokens[index * TOKENS_PER_ITEM : (index + 1) * TOKENS_PER_ITEM], np.int32))


def _pair_item(dataset: Any, index: int) -> dict[str, Any]:
    source, target, source_text, target_text = dataset[index]
    return {
        "index": index,
        "src": np.asarray(source, np.int32),
        "tgt": np.asarray(target, np.int32),
        "src_text": source_text,
        "tgt_text": target_text,
    }


def _sequence_item(tokens: torch.Tensor, labels: torch.Tensor, index: int) -> dict[str, Any]:
    return {"index": index, "tokens": tokens[index].numpy(), "label": int(labels[index])}


def split_items(datamodule: Any, kind: str, split: str) -> tuple[Callable[[int], Any], int]:
    """(item of index i, number of items) of one split of a set-up data module."""
    if kind == "images":
        dataset = getattr(datamodule, f"{split}_set")
        return functools.partial(_image_item, dataset.images, dataset.labels), len(dataset)
    if kind == "captions":
        dataset = getattr(datamodule, f"{split}_set")
        item = functools.partial(_caption_item, dataset, datamodule.image_size, datamodule.in_channels or 3)
        return item, len(dataset)
    if kind == "tokens":
        tokens = datamodule.splits.get(split, datamodule.splits["val"])
        return functools.partial(_token_item, tokens), -(-len(tokens) // TOKENS_PER_ITEM)
    if kind == "sequences":
        tokens, labels = datamodule.splits[split].tensors
        return functools.partial(_sequence_item, tokens, labels), len(tokens)
    dataset = datamodule.dataset(split)
    return functools.partial(_pair_item, dataset), len(dataset)


def describe(datamodule: Any, kind: str) -> dict[str, Any]:
    """What a model needs to know of the data, stored in zoo.json."""
    if kind == "images":
        preprocessing = datamodule.preprocessing()
        return {
            "classes": list(datamodule.classes),
            "image_size": preprocessing.image_size,
            "in_channels": preprocessing.in_channels,
            "mean": list(datamodule.mean),
            "std": list(datamodule.std),
            "batch_augmentation": type(datamodule.batch_augmentation()).__name__ if datamodule.augment else None,
            "black": datamodule.black(),
        }
    if kind == "captions":
        preprocessing = datamodule.preprocessing()
        return {
            "classes": list(datamodule.classes),
            "templates": list(datamodule.templates),
            "image_size": preprocessing.image_size,
            "in_channels": preprocessing.in_channels,
            "mean": list(preprocessing.mean),
            "std": list(preprocessing.std),
            "tokenizer": tokenizer_to_string(datamodule.tokenizer),
        }
    if kind == "sequences":
        return {
            "classes": [str(name) for name in getattr(datamodule, "classes", ())],
            "vocab_size": datamodule.vocab_size,
            "max_length": datamodule.max_length,
            "num_classes": datamodule.num_classes,
            "padding_id": datamodule.padding_id,
        }
    return {"tokenizer": tokenizer_to_string(datamodule.tokenizer)}


def chunk_checks(folder: Path) -> dict[str, dict[str, int]]:
    """{chunk file: {bytes, crc32}} of a litdata dataset folder."""
    checks = {}
    for chunk in json.loads((folder / "index.json").read_text())["chunks"]:
        path = folder / chunk["filename"]
        checks[chunk["filename"]] = {"bytes": path.stat().st_size, "crc32": crc32_of(path)}
    return checks


def write_shards(datamodule: Any, out: str | Path, chunk_bytes: str = "64MB") -> dict[str, Any]:
    """Convert a data module's train / val / test splits into litdata shards under `out` (new or empty); zoo.json
    is written last, with a progress bar per split. Written in this process with litdata's BinaryWriter (what
    `litdata.optimize` runs in each of its workers): the items come from data already in memory, and starting
    worker processes would cost more than it saves on small data. Returns zoo.json's content."""
    from litdata import TokensLoader
    from litdata.streaming.writer import BinaryWriter
    from tqdm import tqdm

    out = check_output_folder(out)
    kind = kind_of(datamodule)
    datamodule.setup()
    meta: dict[str, Any] = {"format": FORMAT_VERSION, "kind": kind, "source": type(datamodule).__name__}
    meta.update(describe(datamodule, kind))
    meta["splits"] = {}
    for split in SPLITS:
        item, count = split_items(datamodule, kind, split)
        if count == 0:
            raise DataError(f"the {split} split of {type(datamodule).__name__} is empty: nothing to convert")
        folder = out / split
        folder.mkdir(parents=True)
        writer = BinaryWriter(
            str(folder), chunk_bytes=chunk_bytes, item_loader=TokensLoader() if kind == "tokens" else None
        )
        for index in tqdm(range(count), desc=split, unit="item" if kind == "tokens" else "sample"):
            writer[index] = item(index)
        writer.done()
        writer.merge()
        meta["splits"][split] = {"items": count, "chunks": chunk_checks(folder)}
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


# -- reading ----------------------------------------------------------------------------------------------
def read_meta(data_dir: str | Path, kind: str | None = None) -> dict[str, Any]:
    """zoo.json of a shards folder; one DataError for a folder that is not one (of this kind)."""
    folder = Path(str(data_dir)).expanduser()
    path = folder / META
    if not path.is_file():
        what = "an unfinished conversion (no zoo.json)" if folder.is_dir() and any(folder.iterdir()) else "missing"
        raise DataError(
            f"data.data_dir={str(data_dir)!r} is not a shards folder ({what}); write one with "
            "python run.py mode=shard data=<data> out=<folder>"
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(
            f"{path} is not valid JSON (cut off?); write the shards again with python run.py mode=shard "
            "data=<data> out=<folder>"
        ) from None
    if kind is not None and meta.get("kind") != kind:
        raise DataError(
            f"data.data_dir={str(data_dir)!r} holds {meta.get('kind')} shards; this data config reads {kind}"
        )
    return meta


def shard_info(data_dir: str, key: str) -> Any:
    """`${shard_info:<folder>,num_classes}` and the like: what a model config reads from a shards folder."""
    meta = read_meta(data_dir)
    if key in meta:  # token sequences store their sizes as they are
        return meta[key]
    if key == "num_classes":
        return len(meta.get("classes", [])) or None
    if key == "vocab_size":
        return tokenizer_from_string(meta["tokenizer"]).get_vocab_size()
    raise DataError(f"the shards in {data_dir} ({meta.get('kind')}) have no {key!r}; they have: {sorted(meta)}")


def check_agrees(data_dir: str | Path, **given: Any) -> None:
    """Options a config sets (image_size, vocab_size, ...) must be the shards folder's own, or null."""
    for key, value in given.items():
        if value is not None and value != (found := shard_info(str(data_dir), key)):
            raise DataError(f"data.{key}={value}, but the shards in {data_dir} have {found}; leave it at its default")


def bad_chunks(folder: Path, checks: dict[str, dict[str, int]], verify: bool) -> dict[str, str]:
    """{chunk file: what is wrong} for the chunks of a split: missing or of the wrong size (always), or of the
    wrong CRC-32 (verify: reads every shard once)."""
    bad = {}
    for name, expected in checks.items():
        path = folder / name
        if not path.is_file():
            bad[name] = "missing"
        elif path.stat().st_size != expected["bytes"]:
            bad[name] = f"truncated: {path.stat().st_size} of {expected['bytes']} bytes"
        elif verify and crc32_of(path) != expected["crc32"]:
            bad[name] = "corrupt: CRC-32 differs from the one written"
    return bad


def crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


def usable_split(data_dir: Path, split: str, meta: dict[str, Any], verify: bool, skip_bad_shards: bool) -> Path:
    """The folder litdata reads a split from: the split itself, or, with skip_bad_shards and bad chunks, a view of
    the good chunks only (a temporary folder of links and a trimmed index). Bad chunks without skip_bad_shards are
    one DataError naming the first."""
    folder = data_dir / split
    bad = bad_chunks(folder, meta["splits"][split]["chunks"], verify)
    if not bad:
        return folder
    name, why = next(iter(bad.items()))
    if not skip_bad_shards:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise DataError(
            f"shard {folder / name} is {why}{more}; convert again, or pass data.skip_bad_shards=true to train "
            "without it"
        )
    index = json.loads((folder / "index.json").read_text())
    kept = [chunk for chunk in index["chunks"] if chunk["filename"] not in bad]
    if not kept:
        raise DataError(f"every shard of {folder} is truncated or corrupt, e.g. {folder / name} ({why})")
    skipped = sum(chunk["chunk_size"] for chunk in index["chunks"] if chunk["filename"] in bad)
    log.warning(f"skipping {len(bad)} bad shard(s) of {folder} ({skipped} samples), e.g. {name}: {why}")
    view = Path(tempfile.mkdtemp(prefix=f"zoo-shards-{split}-"))
    for chunk in kept:
        os.symlink(folder / chunk["filename"], view / chunk["filename"])
    (view / "index.json").write_text(json.dumps({**index, "chunks": kept}))
    return view


def corrupt_shard_error(folder: Path, checks: dict[str, dict[str, int]], error: Exception) -> DataError | None:
    """After litdata failed to read a split (a flipped bit of a chunk of the right size ends in whatever its decoder
    meets: a KeyError, a struct.error, a reshape): the DataError naming the chunk whose CRC-32 differs, or None when
    every chunk is as written (then the error is not the shards')."""
    bad = bad_chunks(folder, checks, verify=True)
    if not bad:
        return None
    name, why = next(iter(bad.items()))
    path = Path(os.path.realpath(folder / name))  # a skip_bad_shards view links to the chunk itself
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    module, kind = type(error).__module__, type(error).__name__
    kind = kind if module == "builtins" else f"{module}.{kind}"  # struct.error, not "error"
    return DataError(
        f"shard {path} is {why}{more} ({kind} while reading it); convert again, or pass "
        "data.verify=true data.skip_bad_shards=true to train without it (data.verify=true checks every shard first)"
    )


def streaming_loader_class() -> type:
    """litdata's StreamingDataLoader, restoring its position at the start of the next iteration only.

    Two things make litdata's own resume go wrong under Lightning: Lightning builds and iterates the training loader
    before it restores the loops (to count the steps of a learning-rate schedule), keeps that iterator for the first
    epoch and never hands the loader the saved state; and it ends an epoch by counting batches, without exhausting
    litdata's generator, whose `restore` flag then replays the restored position's tail as the next epoch. So the
    data module carries the position in its own checkpoint entry (ShardsDataModule.state_dict, restored before the
    loader is built), and a state given to `load_state_dict` serves the next iteration and no other.

    Each iteration draws the workers' base seed from a generator of the loader's own, seeded by (seed, epoch),
    not from torch's global one (as a DataLoader does by default, when it builds its iterator at the first batch):
    reading shards then takes nothing from the generators whose states travel in the checkpoint
    (zoo.training.callbacks.ResumeState), so a run resumed mid-epoch draws the uninterrupted run's dropout masks,
    MixUp shares and augmentations, and its workers get the uninterrupted run's seeds."""
    from litdata import StreamingDataLoader

    class Loader(StreamingDataLoader):
        pending: dict[str, Any] | None = None

        def __init__(self, *args: Any, seed: int = 0, shards: tuple[Path, dict] | None = None, **kwargs: Any) -> None:
            super().__init__(*args, generator=torch.Generator(), **kwargs)
            self.seed = seed
            self.shards = shards  # (split folder, its chunks' sizes and CRC-32s): a failed read is checked against them

        def load_state_dict(self, obj: dict[str, Any]) -> None:
            self.pending = obj

        def __iter__(self) -> Any:
            if self.pending is not None:
                super().load_state_dict(self.pending)  # sets `restore`: this iteration goes on from there
                self.pending = None
            elif self.restore:
                self.restore = False  # the restored position was used up by the previous iteration: a new epoch
            epoch = self.current_epoch if self.restore else self.current_epoch + 1  # as litdata's __iter__ counts
            self.generator.manual_seed(self.seed * 1_000_003 + epoch)
            return self.checked(super().__iter__())

        def checked(self, batches: Any) -> Any:
            """The batches; an error of litdata's decoder caused by a corrupt chunk becomes the DataError naming it."""
            try:
                yield from batches
            except (DataError, OSError):
                raise
            except Exception as error:
                found = corrupt_shard_error(*self.shards, error) if self.shards else None
                if found is None:
                    raise
                raise found from error

    return Loader


class ShardsDataModule(SplitDataModule):
    """Base of the data modules that stream a shards folder (`data.data_dir`): the checks of the folder and
    its chunks, and one StreamingDataLoader per split (train shuffled by chunk and within a window, seeded by
    `seed` and the epoch; val and test in order). Subclasses set `kind` and implement `collate`."""

    kind = ""

    def __init__(
        self,
        data_dir: str,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        verify: bool = False,
        skip_bad_shards: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise DataError(f"data.batch_size must be a positive int, got {batch_size!r}")
        self.data_dir = Path(str(data_dir)).expanduser()
        self.meta = read_meta(self.data_dir, self.kind)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.verify = verify
        self.skip_bad_shards = skip_bad_shards
        self._folders: dict[str, Path] = {}
        self.train_loader: Any = None
        self.saved_position: dict[str, Any] | None = None  # from a checkpoint, until the training loader exists

    def split_folder(self, split: str) -> Path:
        if split not in self._folders:
            self._folders[split] = usable_split(self.data_dir, split, self.meta, self.verify, self.skip_bad_shards)
        return self._folders[split]

    def dataset(self, split: str) -> Any:
        from litdata import StreamingDataset

        train = split == "train"
        return StreamingDataset(
            str(self.split_folder(split)),
            shuffle=self.shuffle and train,
            seed=self.seed,
            drop_last=self.drop_last and train,
            item_loader=self.item_loader(),
        )

    def item_loader(self) -> Any:
        return None

    def collate(self, samples: list[Any]) -> Any:
        raise NotImplementedError

    def stream_loader(self, split: str, collate: Callable[[list[Any]], Any] | None = None) -> Any:
        """A StreamingDataLoader over one split, batches made by `collate` (default: the module's)."""
        folder = self.split_folder(split)  # without the chunks skip_bad_shards left out
        chunks = self.meta["splits"][split]["chunks"]
        checks = {name: check for name, check in chunks.items() if (folder / name).exists()}
        loader = streaming_loader_class()(
            self.dataset(split),
            batch_size=self.batch_size_of(split),
            num_workers=self.num_workers,
            collate_fn=collate or self.collate,
            persistent_workers=False,
            seed=self.seed,
            shards=(folder, checks),
        )
        if split == "train":
            self.train_loader = loader
            if self.saved_position is not None:
                loader.load_state_dict(self.saved_position["loader"])
                self.saved_position = None
        return loader

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (Lightning stores it in checkpoints)."""
        return {} if self.train_loader is None else {"loader": self.train_loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.train_loader is not None:
            self.train_loader.load_state_dict(state_dict["loader"])
        else:
            self.saved_position = state_dict

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            self.split_folder(split)  # every split's chunks checked before training starts

    def loader(self, split: str) -> Any:
        return self.stream_loader(split)


def image_batch(samples: Sequence[dict[str, Any]], mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    images = torch.stack([torch.as_tensor(sample["image"]) for sample in samples]).float().div_(255)
    return (images - mean) / std


class StreamingImagesDataModule(ShardsDataModule):
    """Image classification from a shards folder (`data=images_stream`): (images, labels) batches normalised
    with the source data's statistics; with `augment`, the source's batch augmentation (crops and mirrors)."""

    kind = "images"

    def __init__(
        self,
        augment: bool = True,
        patch_size: int | None = None,
        image_size: int | None = None,
        in_channels: int | None = None,
        num_classes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        meta = self.meta
        check_agrees(self.data_dir, image_size=image_size, in_channels=in_channels, num_classes=num_classes)
        self.patch_size = patch_size
        self.classes = tuple(meta["classes"])
        self.image_size, self.in_channels = meta["image_size"], meta["in_channels"]
        self.num_classes = len(self.classes)
        self.mean, self.std = tuple(meta["mean"]), tuple(meta["std"])
        self._mean = torch.tensor(self.mean).view(-1, 1, 1)
        self._std = torch.tensor(self.std).view(-1, 1, 1)
        self.train_augment = None
        if augment and meta.get("batch_augmentation") == "RandomCropFlip":
            self.train_augment = RandomCropFlip(padding=max(1, self.image_size // 16), flip=True, fill=meta["black"])

    def preprocessing(self) -> ImagePreprocessing:
        return ImagePreprocessing(self.image_size, self.in_channels, self.mean, self.std, self.classes)

    def collate(self, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.tensor([sample["label"] for sample in samples], dtype=torch.long)
        return image_batch(samples, self._mean, self._std), labels

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        images, labels = batch
        if self.train_augment is not None and self.trainer is not None and self.trainer.training:
            images = self.train_augment.to(images.device)(images)
        return images, labels


class CaptionShards(ShardsDataModule):
    """The shards of StreamingCaptionsDataModule (which is a CaptionDataModule, as the CLIP task asks)."""

    kind = "captions"


class StreamingCaptionsDataModule(CaptionDataModule):
    """Image-caption pairs from a shards folder (`data=captions_stream`) for CLIP, with the tokenizer the
    conversion trained (stored in zoo.json); batches as CaptionDataModule's."""

    def __init__(
        self,
        data_dir: str,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        max_length: int = 32,
        seed: int = 0,
        patch_size: int | None = None,
        image_size: int | None = None,
        in_channels: int | None = None,
        num_classes: int | None = None,
        vocab_size: int | None = None,
        **stream_options: Any,
    ) -> None:
        check_agrees(data_dir, image_size=image_size, in_channels=in_channels, num_classes=num_classes,
                     vocab_size=vocab_size)  # fmt: skip
        self.shards = CaptionShards(data_dir, batch_size, eval_batch_size, num_workers, seed, **stream_options)
        meta = self.shards.meta
        super().__init__(batch_size, eval_batch_size, num_workers, max_length=max_length,
                         image_size=meta["image_size"], in_channels=meta["in_channels"],
                         patch_size=patch_size, vocab_size=vocab_size)  # fmt: skip
        self.classes, self.templates = tuple(meta["classes"]), tuple(meta["templates"])
        self.num_classes = len(self.classes) or None
        self.mean, self.std = tuple(meta["mean"]), tuple(meta["std"])
        self._mean = torch.tensor(self.mean).view(-1, 1, 1)
        self._std = torch.tensor(self.std).view(-1, 1, 1)

    def preprocessing(self) -> ImagePreprocessing:
        return ImagePreprocessing(self.image_size, self.in_channels, self.mean, self.std, self.classes)

    def setup(self, stage: str | None = None) -> None:
        self.shards.setup()
        if self.tokenizer is None:
            self.tokenizer = prepare_caption_tokenizer(
                tokenizer_from_string(self.shards.meta["tokenizer"]), self.max_length
            )

    def tokenizer_captions(self) -> list[str]:
        return [caption for template in self.templates for caption in (template.format(label=c) for c in self.classes)]

    def collate(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        captions = [sample["caption"] for sample in samples]
        return {
            "images": image_batch(samples, self._mean, self._std),
            "tokens": encode_captions(self.tokenizer, captions),
            "captions": captions,
            "match_ids": torch.tensor([sample["match_id"] for sample in samples], dtype=torch.long),
            "labels": torch.tensor([sample["label"] for sample in samples], dtype=torch.long),
        }

    def state_dict(self) -> dict[str, Any]:
        return self.shards.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.shards.load_state_dict(state_dict)

    def loader(self, split: str) -> Any:
        if self.tokenizer is None:
            self.setup()
        return self.shards.stream_loader(split, self.collate)


class StreamingTextDataModule(ShardsDataModule):
    """A token stream from a shards folder (`data=text_stream`) for GPT: windows of block_size + 1 tokens laid
    end to end over the stream (litdata's TokensLoader, as litgpt), shuffled by chunk in training; (x, y) batches
    as TextDataModule's, an epoch is one pass over the training tokens."""

    kind = "tokens"

    def __init__(self, block_size: int = 64, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(block_size, int) or block_size <= 0:
            raise DataError(f"data.block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.tokenizer = tokenizer_from_string(self.meta["tokenizer"])

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def use_tokenizer(self, tokenizer: Any) -> None:
        if tokenizer_to_string(tokenizer) != tokenizer_to_string(self.tokenizer):
            raise DataError("the shards were tokenised with another tokenizer than the model's; convert them again")

    def item_loader(self) -> Any:
        from litdata import TokensLoader

        return TokensLoader(block_size=self.block_size + 1)

    def collate(self, windows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        windows = torch.stack(windows).long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class StreamingParallelTextDataModule(ShardsDataModule):
    """Sentence pairs from a shards folder (`data=parallel_text_stream`) for translation, encoded with the
    conversion's joint BPE; batches of `batch_size` pairs (not token-bucketed: buckets need every length up front)
    as TranslationDataModule's dicts."""

    kind = "parallel_text"

    def __init__(self, vocab_size: int | None = None, max_length: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_agrees(self.data_dir, vocab_size=vocab_size)
        self.tokenizer = tokenizer_from_string(self.meta["tokenizer"])
        self.vocab_size, self.max_length = self.tokenizer.get_vocab_size(), max_length

    def use_tokenizer(self, tokenizer: Any) -> None:
        if tokenizer_to_string(tokenizer) != tokenizer_to_string(self.tokenizer):
            raise DataError("the shards were encoded with another tokenizer than the model's; convert them again")

    def collate(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.token_to_id(PAD)
        return {
            "src": pad_sequences([sample["src"].tolist() for sample in samples], pad),
            "tgt": pad_sequences([sample["tgt"].tolist() for sample in samples], pad),
            "src_text": [sample["src_text"] for sample in samples],
            "tgt_text": [sample["tgt_text"] for sample in samples],
        }


class StreamingSequencesDataModule(ShardsDataModule):
    """Token-sequence classification from a shards folder (`data=sequences_stream`) for the sequence classifier:
    (token ids (B, max_length) int64, labels (B,)) batches as TokenSequenceDataModule's (pixel sequences, ListOps,
    hf_sequences), and with `packing` (padded sequences only) its packed batches."""

    kind = "sequences"

    def __init__(
        self,
        vocab_size: int | None = None,
        max_length: int | None = None,
        num_classes: int | None = None,
        padding_id: int | None = None,
        packing: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_agrees(self.data_dir, vocab_size=vocab_size, max_length=max_length, num_classes=num_classes,
                     padding_id=padding_id)  # fmt: skip
        meta = self.meta
        self.classes = tuple(meta["classes"])
        self.vocab_size, self.max_length = meta["vocab_size"], meta["max_length"]
        self.num_classes, self.padding_id = meta["num_classes"], meta["padding_id"]
        if packing and self.padding_id is None:
            raise DataError("data.packing=true packs padded sequences, but these shards have none (padding_id null)")
        self.packing = packing

    def collate(self, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
        pairs = [(torch.as_tensor(sample["tokens"]), torch.tensor(sample["label"])) for sample in samples]
        return pack_sequences(pairs, self.padding_id) if self.packing else collate_tokens(pairs)
