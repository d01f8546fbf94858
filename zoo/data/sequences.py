"""Token-sequence classification data, the long-range tasks (Long Range Arena, Tay et al. 2021): the shared
base, and images read as sequences of pixels (LRA's "Image" task; sequential / permuted MNIST). ListOps, the
other task, is generated in zoo/data/listops.py.

Every module yields (token ids (B, max_length) int64, labels (B,) int64) batches and names what the model
reads from it: vocab_size, max_length, num_classes and padding_id (None: sequences are never padded).

Packing (`data.packing=true`, padded sequences only): a batch's sequences, their padding stripped, are packed
first-fit-decreasing into rows of max_length tokens, and the batch is (token ids (R, max_length), labels (B,),
document ids (R, max_length)), R <= B rows, labels in the order of the packed sequences. The model attends within
each sequence and pools each by its mean (zoo/models/sequence_classifier.py), so short sequences stop paying
for the padding of the longest.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from zoo.data.images import ImageClassificationDataModule
from zoo.data.splits import SplitDataModule
from zoo.errors import DataError

SPLITS = ("train", "val", "test")


def collate_tokens(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, label) samples -> int64 (B, T) ids and (B,) labels: tokens are kept as bytes, read as ids."""
    tokens, labels = zip(*samples)
    return torch.stack(tokens).long(), torch.stack(labels)


def _without_padding(tokens: torch.Tensor, padding_id: int) -> torch.Tensor:
    """A sequence padded at the end -> its tokens up to the last one that is not padding (at least one)."""
    real = (tokens != padding_id).nonzero()
    return tokens[: int(real.max()) + 1] if len(real) else tokens[:1]


def pack_sequences(
    samples: list[tuple[torch.Tensor, torch.Tensor]], padding_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens padded at the end with padding_id, label) samples -> packed (ids (R, T), labels (B,), document ids
    (R, T)). A row's trailing padding carries the id of its last sequence (it is masked as padding anyway)."""
    length = samples[0][0].shape[0]
    sequences = [(_without_padding(tokens, padding_id), label) for tokens, label in samples]
    rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    room: list[int] = []
    for tokens, label in sorted(sequences, key=lambda sample: -len(sample[0])):  # first fit, longest first
        row = next((i for i, free in enumerate(room) if free >= len(tokens)), None)
        if row is None:
            rows.append([])
            room.append(length)
            row = len(rows) - 1
        rows[row].append((tokens, label))
        room[row] -= len(tokens)
    ids = torch.full((len(rows), length), padding_id, dtype=torch.long)
    document_ids = torch.zeros(len(rows), length, dtype=torch.long)
    labels = []
    for r, row in enumerate(rows):
        start = 0
        for d, (tokens, label) in enumerate(row):
            ids[r, start : start + len(tokens)] = tokens.long()
            document_ids[r, start:] = d
            labels.append(label)
            start += len(tokens)
    return ids, torch.stack(labels), document_ids


class TokenSequenceDataModule(SplitDataModule):
    """Base: subclasses implement `build_splits()` -> {split: (tokens (N, max_length) uint8 or int, labels (N,))}
    for train, val and test. `packing`: batches of packed sequences (the module docstring)."""

    def __init__(
        self,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        vocab_size: int = 256,
        max_length: int = 784,
        num_classes: int = 10,
        padding_id: int | None = None,
        packing: bool = False,
    ) -> None:
        super().__init__()
        if packing and padding_id is None:
            raise DataError("data.packing=true packs padded sequences, but this data set has none (padding_id null)")
        self.packing = packing
        for name, value in (("batch_size", batch_size), ("max_length", max_length), ("vocab_size", vocab_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise DataError(f"data.{name} must be a positive int, got {value!r}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.vocab_size, self.max_length = vocab_size, max_length
        self.num_classes, self.padding_id = num_classes, padding_id
        self.splits: dict[str, TensorDataset] = {}

    def build_splits(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        name = type(self).__name__
        for split, (tokens, labels) in self.build_splits().items():
            if tokens.shape[1] != self.max_length:
                raise DataError(
                    f"{name} writes sequences of {tokens.shape[1]} tokens, but data.max_length={self.max_length}; "
                    f"set data.max_length={tokens.shape[1]}"
                )
            if len(tokens) and int(tokens.max()) >= self.vocab_size:
                raise DataError(f"{name} has token id {int(tokens.max())}, but data.vocab_size={self.vocab_size}")
            if len(labels) and int(labels.max()) >= self.num_classes:
                raise DataError(f"{name} has {int(labels.max()) + 1} classes, but data.num_classes={self.num_classes}")
            self.splits[split] = TensorDataset(tokens, labels)

    def loader(self, split: str) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.batch_size_of(split), shuffle=split == "train",
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          collate_fn=self.collate)  # fmt: skip

    def collate(self, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        return pack_sequences(samples, self.padding_id) if self.packing else collate_tokens(samples)


class PixelSequenceDataModule(TokenSequenceDataModule):
    """An image dataset (any zoo.data.images module; its splits) read as sequences of 8-bit pixel values, row by
    row (channels interleaved per pixel): Fashion-MNIST gives 784 tokens of a 256 vocabulary, as LRA's Image
    task reads CIFAR-10 (1024 tokens). The image module's augmentation and normalisation do not apply: the
    tokens are the raw pixels.

    permute: every sequence is put in one fixed random order (permuted MNIST), the same for every image and
    split, drawn from `permutation_seed`; it removes the locality of neighbouring pixels.
    """

    def __init__(
        self, images: ImageClassificationDataModule, permute: bool = False, permutation_seed: int = 0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.images = images
        self.permute = permute
        self.permutation_seed = permutation_seed
        self.classes: tuple[str, ...] = ()

    def permutation(self, length: int) -> torch.Tensor:
        """The fixed order of the positions (the identity unless permute)."""
        if not self.permute:
            return torch.arange(length)
        return torch.randperm(length, generator=torch.Generator().manual_seed(self.permutation_seed))

    def build_splits(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        self.images.setup()
        self.classes = tuple(self.images.classes)
        splits = {}
        for split in SPLITS:
            dataset = getattr(self.images, f"{split}_set")
            if dataset.images.dtype != torch.uint8:
                raise DataError(f"{type(self.images).__name__} holds {dataset.images.dtype} images, not 8-bit pixels")
            tokens = dataset.images.permute(0, 2, 3, 1).flatten(1)  # (N, H * W * C) in raster order
            splits[split] = (tokens[:, self.permutation(tokens.shape[1])], dataset.labels)
        return splits
