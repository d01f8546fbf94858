"""Pixel sequences: images read as their 8-bit pixels in raster order, the fixed permutation, the image module's
splits, and one-line errors for a length or vocabulary that does not fit."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_fashion_mnist
from zoo.data.images import DigitsDataModule, FashionMNISTDataModule
from zoo.data.sequences import PixelSequenceDataModule
from zoo.errors import DataError


def digits_sequences(**settings) -> PixelSequenceDataModule:
    data = PixelSequenceDataModule(DigitsDataModule(val_fraction=0.1), max_length=64, batch_size=16, **settings)
    data.setup()
    return data


def test_digits_become_64_pixel_tokens_in_raster_order_on_the_image_splits() -> None:
    data = digits_sequences()
    images = data.images
    assert {split: len(data.splits[split]) for split in ("train", "val", "test")} == {
        "train": len(images.train_set), "val": len(images.val_set), "test": len(images.test_set)
    }  # fmt: skip
    tokens, labels = data.splits["test"].tensors
    torch.testing.assert_close(tokens, images.test_set.images.flatten(1))  # row by row, the raw 8-bit pixels
    assert torch.equal(labels, images.test_set.labels)
    batch, batch_labels = next(iter(data.val_dataloader()))
    assert batch.shape == (16, 64) and batch.dtype == torch.long and int(batch.max()) <= 255
    assert batch_labels.shape == (16,) and data.classes == tuple(str(d) for d in range(10))


def test_permute_applies_one_fixed_order_to_every_image_and_split() -> None:
    plain, permuted = digits_sequences(), digits_sequences(permute=True)
    order = permuted.permutation(64)
    assert sorted(order.tolist()) == list(range(64)) and order.tolist() != list(range(64))
    for split in ("train", "val", "test"):
        torch.testing.assert_close(permuted.splits[split].tensors[0], plain.splits[split].tensors[0][:, order])
    assert torch.equal(digits_sequences(permute=True).permutation(64), order)  # the same order every time
    other = digits_sequences(permute=True, permutation_seed=1).permutation(64)
    assert not torch.equal(other, order)  # the seed picks it


def test_fashion_mnist_gives_784_tokens(tmp_path) -> None:
    folder = tiny_fashion_mnist(tmp_path / "fashion-mnist", train=40, test=10)
    images = FashionMNISTDataModule(data_dir=str(folder), download=False, val_fraction=0.25)
    data = PixelSequenceDataModule(images, max_length=784, batch_size=8)
    data.setup()
    tokens, _ = next(iter(data.train_dataloader()))
    assert tokens.shape == (8, 784) and len(data.splits["test"]) == 10


def test_a_length_that_does_not_fit_names_the_right_one() -> None:
    with pytest.raises(DataError, match="64 tokens, but data.max_length=784; set data.max_length=64"):
        PixelSequenceDataModule(DigitsDataModule(), max_length=784).setup()


def test_a_vocabulary_too_small_for_8_bit_pixels_is_an_error() -> None:
    with pytest.raises(DataError, match="data.vocab_size=16"):
        PixelSequenceDataModule(DigitsDataModule(), max_length=64, vocab_size=16).setup()
