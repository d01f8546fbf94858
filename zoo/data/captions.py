"""Image-caption data for CLIP: captions written from class names with prompt templates, or pairs from a file.

Every module yields dict batches: images (B, C, H, W) float, tokens (B, T) ids (<bos> caption <eos>, padded),
captions (the strings), match_ids (B,) and labels (B,).
match_ids say which captions fit which images in retrieval: the class for labelled data ("a photo of a
coat." fits every coat), the image for caption files (several captions may describe one image).
labels are class indices for zero-shot classification, -1 when the data has no classes.

The tokenizer is a Hugging Face `tokenizers` one trained on the training captions; the CLIP task saves it
in its checkpoints and hands it back with `use_tokenizer` when a checkpoint is loaded.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, processors
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from zoo.data.images import ImageClassificationDataModule
from zoo.data.preprocessing import ImagePreprocessing
from zoo.data.samples import NamedSamples
from zoo.data.splits import SplitDataModule
from zoo.data.tokenizers import BOS, EOS, PAD, batched, train_tokenizer
from zoo.errors import DataError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's image statistics
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Prompt templates in the spirit of CLIP's ImageNet prompts (Radford et al. 2021, section 3.1.4).
DEFAULT_TEMPLATES = (
    "a photo of a {label}.",
    "a blurry photo of a {label}.",
    "a black and white photo of a {label}.",
    "a low resolution photo of a {label}.",
    "a close-up photo of a {label}.",
    "a photo of the {label}.",
    "a picture of a {label}.",
    "an image of a {label}.",
)


def fill_templates(templates: Sequence[str], classes: Sequence[str]) -> list[list[str]]:
    """(templates, classes) -> captions[t][c] = templates[t] with {label} = classes[c]."""
    if not templates:
        raise DataError("data.templates must hold at least one prompt template such as 'a photo of a {label}.'")
    for template in templates:
        if "{label}" not in template:
            raise DataError(f"every prompt template needs a {{label}} field, got {template!r}")
    return [[template.format(label=name) for name in classes] for template in templates]


# -- tokenizer --------------------------------------------------------------------------------------------
def prepare_caption_tokenizer(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    """Truncate to max_length tokens (the end-of-text token is kept) and pad batches to their longest
    caption with <pad> (or, lacking one, the end-of-text token: causal attention never sees what follows it).
    The tokenizer must already wrap texts in its start and end tokens (its post-processor)."""
    if max_length < 2:
        raise DataError(f"data.max_length must be at least 2 (start and end tokens), got {max_length}")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    wrapped = tokenizer.encode("").ids
    if not wrapped:
        raise DataError("the caption tokenizer adds no end-of-text token (it needs a post-processor)")
    pad_id = tokenizer.token_to_id(PAD)
    pad_id = wrapped[-1] if pad_id is None else pad_id
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=tokenizer.id_to_token(pad_id))
    return tokenizer


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The id the tokenizer closes every caption with."""
    return tokenizer.encode("").ids[-1]


def train_caption_tokenizer(
    captions: Sequence[str], kind: str = "bpe", vocab_size: int | None = 512, max_length: int = 32
) -> Tokenizer:
    """A tokenizer (data.tokenizer: bpe | char) trained on `captions`, writing <bos> caption <eos>."""
    tokenizer = train_tokenizer(kind, batched(captions), vocab_size if kind == "bpe" else None)
    markers = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, tokenizer.token_to_id(BOS)), (EOS, tokenizer.token_to_id(EOS))]
    )
    previous = tokenizer.post_processor
    tokenizer.post_processor = processors.Sequence([previous, markers]) if previous is not None else markers
    return prepare_caption_tokenizer(tokenizer, max_length)


def encode_captions(tokenizer: Tokenizer, captions: Sequence[str]) -> torch.Tensor:
    """Captions -> (B, T) int64 ids, T = the longest caption in tokens (at most the truncation length)."""
    return torch.tensor([encoding.ids for encoding in tokenizer.encode_batch(list(captions))], dtype=torch.long)


# -- datasets ---------------------------------------------------------------------------------------------
class TemplateCaptionDataset(Dataset):
    """Wraps an (image, label) dataset: the caption is a prompt template filled with the class name.

    Training draws a template at random for every sample (a cheap text augmentation); evaluation cycles
    through them deterministically (sample i gets template i mod T).
    """

    def __init__(
        self, images: Dataset, classes: Sequence[str], templates: Sequence[str], random_template: bool
    ) -> None:
        self.images, self.classes, self.templates = images, tuple(classes), tuple(templates)
        self.random_template = random_template

    def __len__(self) -> int:
        return len(self.images)

    def sample_source(self, index: int) -> str | None:
        source = getattr(self.images, "sample_source", None)
        return source(index) if source is not None else None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, int, int]:
        image, label = self.images[index]
        if self.random_template:
            template = self.templates[int(torch.randint(len(self.templates), ()))]
        else:
            template = self.templates[index % len(self.templates)]
        return image, template.format(label=self.classes[label]), label, label


class CaptionFileDataset(Dataset):
    """(image path, caption, image index) rows; images decoded and transformed on access."""

    def __init__(self, rows: list[tuple[Path, str, int]], transform: Any, channels: int) -> None:
        from torchvision.io import ImageReadMode

        self.rows, self.transform = rows, transform
        self.mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY

    def __len__(self) -> int:
        return len(self.rows)

    def sample_source(self, index: int) -> str:
        return str(self.rows[index][0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, int, int]:
        from torchvision.io import decode_image

        path, caption, image_index = self.rows[index]
        return self.transform(decode_image(str(path), mode=self.mode)), caption, image_index, -1


# -- data modules -----------------------------------------------------------------------------------------
class CaptionDataModule(SplitDataModule):
    """Base: loaders of caption batches and the caption tokenizer. Subclasses implement `build_datasets()`
    -> (train, val, test) datasets of (image, caption, match_id, label), set `classes` and `templates`
    (for zero-shot classification; empty without classes), and `tokenizer_captions()`."""

    classes: tuple[str, ...] = ()
    templates: tuple[str, ...] = ()

    def __init__(
        self,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        tokenizer: str = "bpe",
        vocab_size: int | None = 512,
        max_length: int = 32,
        image_size: int | None = None,
        in_channels: int | None = None,
        patch_size: int | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise DataError(f"data.batch_size must be a positive int, got {batch_size}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.tokenizer_kind = tokenizer
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.image_size = image_size
        self.in_channels = in_channels
        self.patch_size = patch_size  # the ViT patch size that suits these images (models read ${data.patch_size})
        if patch_size is not None and image_size is not None and (patch_size <= 0 or image_size % patch_size):
            raise DataError(
                f"image size must be divisible by patch size, got data.image_size={image_size} and "
                f"data.patch_size={patch_size}"
            )
        self.num_classes = num_classes  # class names for zero-shot classification; None for free captions
        self.tokenizer: Tokenizer | None = None
        self.train_set = self.val_set = self.test_set = None

    def build_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        raise NotImplementedError

    def tokenizer_captions(self) -> list[str]:
        """The texts the tokenizer is trained on."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set, self.test_set = self.build_datasets()
        if self.tokenizer is None:
            self.tokenizer = train_caption_tokenizer(
                self.tokenizer_captions(), self.tokenizer_kind, self.vocab_size, self.max_length
            )
            self.check_captions_fit()

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Tokenize with `tokenizer` (a checkpoint's, or a pretrained model's) instead of training one."""
        self.tokenizer = prepare_caption_tokenizer(tokenizer, self.max_length)
        if self.train_set is not None:
            self.check_captions_fit()

    def check_captions_fit(self) -> None:
        """Raise if truncation to max_length would cut captions that must stay whole (free captions may be cut)."""

    def zero_shot_prompts(self) -> list[list[str]]:
        """prompts[t][c]: every template filled with every class name; [] without classes."""
        return fill_templates(self.templates, self.classes) if self.classes else []

    def collate(self, samples: list[tuple[torch.Tensor, str, int, int]]) -> dict[str, Any]:
        images, captions, match_ids, labels = zip(*samples)
        return {
            "images": torch.stack(images),
            "tokens": encode_captions(self.tokenizer, captions),
            "captions": list(captions),
            "match_ids": torch.tensor(match_ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
        }

    def loader(self, split: str) -> DataLoader:
        if self.tokenizer is None:
            raise RuntimeError("call setup() before asking for a data loader (the tokenizer is trained there)")
        dataset, batch_size, shuffle = getattr(self, f"{split}_set"), self.batch_size_of(split), split == "train"
        return DataLoader(
            NamedSamples(dataset, split, self.num_workers),  # a failing sample or a dead worker is named
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            persistent_workers=self.num_workers > 0,
            # A last training batch of a few pairs has almost no negatives: a noisy step, dropped.
            drop_last=shuffle and len(dataset) > batch_size,
        )


class LabelledCaptionDataModule(CaptionDataModule):
    """Captions for a labelled image dataset (any zoo.data.images module: digits, Fashion-MNIST, ...):
    "a photo of a {label}." with the dataset's class names. Splits are the image module's own."""

    def __init__(
        self, images: ImageClassificationDataModule, templates: Sequence[str] = DEFAULT_TEMPLATES, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.images = images
        self.templates = tuple(templates)
        fill_templates(self.templates, ["x"])  # validate early
        for key in ("image_size", "in_channels", "num_classes"):
            outer, inner = getattr(self, key), getattr(images, key)
            if outer is not None and inner is not None and outer != inner:
                raise DataError(f"data.{key}={outer} disagrees with data.images.{key}={inner}; set them alike")

    def preprocessing(self) -> ImagePreprocessing:
        return self.images.preprocessing()

    def build_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        self.images.setup()
        self.classes = tuple(self.images.classes)
        if not self.classes:
            raise DataError(f"{type(self.images).__name__} has no class names to write captions from")
        return tuple(
            TemplateCaptionDataset(split, self.classes, self.templates, random_template=split is self.images.train_set)
            for split in (self.images.train_set, self.images.val_set, self.images.test_set)
        )

    def tokenizer_captions(self) -> list[str]:
        return [caption for row in fill_templates(self.templates, self.classes) for caption in row]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # the image module's batch augmentation (e.g. Fashion-MNIST's crops and mirrors) on training batches
        training = self.trainer is not None and self.trainer.training
        return {**batch, "images": self.images.augment_batch(batch["images"], training)}

    def check_captions_fit(self) -> None:
        # A truncated prompt loses its end, often the class name: every filled template must fit.
        captions = self.tokenizer_captions()
        for caption, encoding in zip(captions, self.tokenizer.encode_batch(captions)):
            if encoding.overflowing:
                raise DataError(
                    f"the caption {caption!r} is longer than data.max_length={self.max_length} tokens; raise it"
                )


class CaptionFileDataModule(CaptionDataModule):
    """Image-caption pairs listed in a CSV file (header with `image` and `caption` columns) or a JSONL file
    ({"image": ..., "caption": ...} per line); image paths are relative to `image_root` (default: the
    file's folder). An image may have several captions; splits are drawn by image, seeded."""

    def __init__(
        self,
        pairs_file: str,
        image_root: str | None = None,
        image_key: str = "image",
        caption_key: str = "caption",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        augment: bool = False,
        mean: Sequence[float] | None = None,  # default: OpenAI CLIP's statistics (RGB), 0.5 (grey)
        std: Sequence[float] | None = None,
        image_size: int = 64,
        in_channels: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(image_size=image_size, in_channels=in_channels, **kwargs)
        if in_channels not in (1, 3):
            raise DataError(f"data.in_channels must be 1 or 3, got {in_channels}")
        for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < fraction < 1.0:
                raise DataError(f"data.{name} must be in (0, 1), got {fraction}")
        if val_fraction + test_fraction >= 1.0:
            raise DataError(
                f"data.val_fraction + data.test_fraction must be below 1, got {val_fraction + test_fraction}"
            )
        self.pairs_file = Path(pairs_file).expanduser()
        self.image_root = Path(image_root).expanduser() if image_root else self.pairs_file.parent
        self.image_key, self.caption_key = image_key, caption_key
        self.val_fraction, self.test_fraction, self.seed = val_fraction, test_fraction, seed
        self.augment = augment
        rgb = in_channels == 3
        self.mean = tuple(mean) if mean is not None else CLIP_MEAN if rgb else (0.5,)
        self.std = tuple(std) if std is not None else CLIP_STD if rgb else (0.5,)
        if len(self.mean) != in_channels or len(self.std) != in_channels:
            raise DataError(f"data.mean and data.std need {in_channels} values each, got {self.mean} and {self.std}")
        self.train_captions: list[str] = []

    def preprocessing(self) -> ImagePreprocessing:
        return ImagePreprocessing(self.image_size, self.in_channels, self.mean, self.std)

    def read_pairs(self) -> list[tuple[str, str]]:
        """(image path, caption) rows of the pairs file."""
        if not self.pairs_file.is_file():
            raise DataError(f"data.pairs_file={str(self.pairs_file)!r} does not exist")
        keys = (self.image_key, self.caption_key)
        if self.pairs_file.suffix.lower() == ".csv":
            with self.pairs_file.open(newline="", encoding="utf-8") as handle:
                records = list(csv.DictReader(handle))
        elif self.pairs_file.suffix.lower() in (".jsonl", ".json"):
            records = []
            with self.pairs_file.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except json.JSONDecodeError:
                            raise DataError(f"{self.pairs_file}:{number} is not a JSON object") from None
        else:
            raise DataError(f"data.pairs_file must end in .csv or .jsonl, got {self.pairs_file.name!r}")
        if not records:
            raise DataError(f"data.pairs_file={str(self.pairs_file)!r} holds no image-caption pairs")
        for number, record in enumerate(records, 1):
            if not isinstance(record, dict) or any(not record.get(key) for key in keys):
                found = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DataError(
                    f"{self.pairs_file} row {number} lacks {list(keys)} (found {found}); "
                    "set data.image_key / data.caption_key"
                )
        return [(str(record[self.image_key]), str(record[self.caption_key])) for record in records]

    def build_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        pairs = self.read_pairs()
        paths = sorted({image for image, _ in pairs})
        absent = [path for path in paths if not (self.image_root / path).is_file()]
        if absent:
            raise DataError(
                f"{len(absent)} images listed in data.pairs_file are not under "
                f"data.image_root={str(self.image_root)!r}, e.g. {absent[:3]}"
            )
        if len(paths) < 3:
            raise DataError(f"data.pairs_file needs at least 3 distinct images (train, val, test), got {len(paths)}")
        order = torch.randperm(len(paths), generator=torch.Generator().manual_seed(self.seed)).tolist()
        num_test = max(1, round(self.test_fraction * len(paths)))
        num_val = max(1, round(self.val_fraction * len(paths)))
        split_of = {}
        for rank, image_index in enumerate(order):
            split_of[image_index] = "test" if rank < num_test else "val" if rank < num_test + num_val else "train"
        index_of = {path: i for i, path in enumerate(paths)}
        rows: dict[str, list[tuple[Path, str, int]]] = {"train": [], "val": [], "test": []}
        for image, caption in pairs:
            rows[split_of[index_of[image]]].append((self.image_root / image, caption, index_of[image]))
        self.train_captions = [caption for _, caption, _ in rows["train"]]
        size = self.image_size
        to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        if self.augment:
            train_resize = [v2.RandomResizedCrop((size, size), scale=(0.8, 1.0), antialias=True)]
        else:
            train_resize = [v2.Resize((size, size), antialias=True)]
        eval_tf = v2.Compose([v2.Resize((size, size), antialias=True), *to_float])
        train_tf = v2.Compose([*train_resize, *to_float])
        return (
            CaptionFileDataset(rows["train"], train_tf, self.in_channels),
            CaptionFileDataset(rows["val"], eval_tf, self.in_channels),
            CaptionFileDataset(rows["test"], eval_tf, self.in_channels),
        )

    def tokenizer_captions(self) -> list[str]:
        return self.train_captions
