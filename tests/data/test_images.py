"""Image data modules: deterministic, disjoint, correctly sized splits; idx files; clear errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.data.images import (
    DigitsDataModule,
    FashionMNISTDataModule,
    ImageFolderDataModule,
    MNISTDataModule,
    RandomCropFlip,
)
from zoo.errors import DataError


def fingerprints(dataset) -> set[bytes]:
    return {dataset.images[i].numpy().tobytes() + bytes([int(dataset.labels[i])]) for i in range(len(dataset))}


def test_digits_splits_are_disjoint_sized_and_deterministic() -> None:
    dm = DigitsDataModule(batch_size=32, val_fraction=0.1, test_fraction=0.2)
    dm.setup()
    sizes = len(dm.train_set), len(dm.val_set), len(dm.test_set)
    assert sizes == (1293, 144, 360)
    train, val, test = fingerprints(dm.train_set), fingerprints(dm.val_set), fingerprints(dm.test_set)
    # digits has a few duplicate images; disjointness is about indices, so compare counts generously
    assert len(train & test) <= 3 and len(train & val) <= 3
    again = DigitsDataModule(batch_size=32)
    again.setup()
    assert torch.equal(again.test_set.images, dm.test_set.images)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (32, 1, 8, 8) and images.dtype == torch.float32
    assert set(labels.tolist()) <= set(range(10))


@pytest.mark.parametrize("augment", [False, True])
def test_deterministic_transforms_run_once_up_front_with_the_same_pixels(augment: bool) -> None:
    dm = DigitsDataModule(batch_size=32, augment=augment, image_size=12)  # a resize, then ToDtype + Normalize
    dm.setup()
    for split in (dm.val_set, dm.test_set):
        assert split.prepared is not None and split.images.dtype == torch.uint8  # originals kept (write_examples)
        for index in (0, 7, len(split) - 1):
            torch.testing.assert_close(split[index][0], split.transform(split.images[index]), atol=1e-6, rtol=0)
    train = dm.train_set
    if augment:  # random shifts: drawn per sample, per epoch
        assert train.prepared is None and any(not torch.equal(train[3][0], train[3][0]) for _ in range(20))
    else:
        assert train.prepared is not None and torch.equal(train[3][0], train.prepared[3])
        torch.testing.assert_close(train[3][0], train.transform(train.images[3]), atol=1e-6, rtol=0)


def test_digits_split_is_stratified() -> None:
    dm = DigitsDataModule()
    dm.setup()
    counts = torch.bincount(dm.test_set.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def make_fake_mnist(folder: Path, n_train: int = 200, n_test: int = 50) -> None:
    rng = np.random.default_rng(0)
    write_idx(folder / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (n_train, 28, 28)))
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(n_train) % 10)
    write_idx(folder / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (n_test, 28, 28)))
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.arange(n_test) % 10)


def test_fashion_mnist_reads_debian_style_idx_gz_files(tmp_path: Path) -> None:
    make_fake_mnist(tmp_path)
    dm = FashionMNISTDataModule(data_dir=str(tmp_path), download=False, batch_size=16, val_fraction=0.1)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (180, 20, 50)
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 1, 28, 28)
    assert len(dm.classes) == 10


def test_missing_dataset_offline_is_one_line_error_with_advice(tmp_path: Path) -> None:
    dm = FashionMNISTDataModule(data_dir=str(tmp_path / "nothing"), download=False)
    with pytest.raises(DataError) as info:
        dm.setup()
    message = str(info.value)
    assert "\n" not in message and "data.data_dir" in message and "dataset-fashion-mnist" in message


def test_truncated_idx_file_is_reported(tmp_path: Path) -> None:
    make_fake_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data[:1000]))
    with pytest.raises(DataError, match="truncated"):
        FashionMNISTDataModule(data_dir=str(tmp_path), download=False).setup()


def test_image_folder_reads_class_folders(tmp_path: Path) -> None:
    from torchvision.io import write_png

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(10):
            write_png(torch.randint(0, 255, (3, 12, 12), dtype=torch.uint8), str(tmp_path / label / f"{i}.png"))
    dm = ImageFolderDataModule(data_dir=str(tmp_path), image_size=8, num_classes=2, batch_size=4, val_fraction=0.25)
    dm.setup()
    assert dm.classes == ("cat", "dog")
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 20
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 8, 8)


def torchvision_candidates(image: torch.Tensor, padding: int, flip: bool, mean, std) -> torch.Tensor:
    """Every output torchvision's RandomCrop(size, padding) (+ RandomHorizontalFlip) can give for a uint8 image,
    normalised: (offsets x mirrors, C, H, W)."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as TF

    size = image.shape[-1]
    padded = TF.pad(image, [padding])
    crops = [padded[..., i : i + size, j : j + size] for i in range(2 * padding + 1) for j in range(2 * padding + 1)]
    crops += [crop.flip(-1) for crop in crops] if flip else []
    to_float = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    return torch.stack([to_float(crop) for crop in crops])


@pytest.mark.parametrize("module, flip", [(FashionMNISTDataModule, True), (MNISTDataModule, False)])
def test_batch_crops_and_mirrors_are_torchvisions_drawn_per_image(module, flip: bool, tmp_path: Path) -> None:
    make_fake_mnist(tmp_path, n_train=400)
    dm = module(data_dir=str(tmp_path), download=False, batch_size=400, val_fraction=0.1)
    dm.setup()
    assert dm.train_set.prepared is not None  # the crops happen on batches, not per sample
    assert isinstance(dm.train_augment, RandomCropFlip) and dm.train_augment.flip is flip
    torch.manual_seed(0)
    images = dm.train_set.prepared
    out = dm.train_augment(images)
    picked = []
    for index in range(len(images)):
        candidates = torchvision_candidates(dm.train_set.images[index], 2, flip, dm.mean, dm.std)
        matches = (candidates - out[index]).abs().flatten(1).amax(dim=1) < 1e-6
        assert matches.any(), f"image {index} is none of torchvision's crops"
        picked.append(int(matches.nonzero()[0]))
    assert len(set(picked)) >= (40 if flip else 22)  # of 50 (25 offsets, mirrored or not) / 25: all get drawn


def test_batch_augmentation_is_for_training_batches_only(tmp_path: Path) -> None:
    from types import SimpleNamespace

    make_fake_mnist(tmp_path)
    dm = FashionMNISTDataModule(data_dir=str(tmp_path), download=False, batch_size=64, val_fraction=0.1)
    dm.setup()
    batch = (dm.train_set.prepared[:64], dm.train_set.labels[:64])
    for training in (True, False):
        dm.trainer = SimpleNamespace(training=training)
        images, labels = dm.on_after_batch_transfer(batch, 0)
        assert torch.equal(labels, batch[1]) and torch.equal(images, batch[0]) is not training
    off = FashionMNISTDataModule(data_dir=str(tmp_path), download=False, augment=False)
    off.setup()
    off.trainer = SimpleNamespace(training=True)
    assert off.train_augment is None and torch.equal(off.on_after_batch_transfer(batch, 0)[0], batch[0])


def test_clip_captions_get_the_image_modules_batch_augmentation(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from zoo.data.captions import LabelledCaptionDataModule

    make_fake_mnist(tmp_path)
    images = FashionMNISTDataModule(data_dir=str(tmp_path), download=False, val_fraction=0.1)
    captions = LabelledCaptionDataModule(images, batch_size=16, max_length=24, vocab_size=300)
    captions.setup()
    batch = next(iter(captions.train_dataloader()))
    for training in (True, False):
        captions.trainer = SimpleNamespace(training=training)
        out = captions.on_after_batch_transfer(batch, 0)
        assert torch.equal(out["tokens"], batch["tokens"])
        assert torch.equal(out["images"], batch["images"]) is not training
