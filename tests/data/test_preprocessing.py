"""Image preprocessing as checkpoints carry it: a test image written by a data module and read back through
ImagePreprocessing is exactly the tensor the test split feeds the model; image inputs are found or named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo.data.images import DigitsDataModule
from zoo.data.preprocessing import ImagePreprocessing, image_files
from zoo.errors import DataError


def test_written_examples_read_back_as_the_test_split_feeds_them(tmp_path: Path) -> None:
    data = DigitsDataModule(image_size=8, in_channels=1, num_classes=10)
    files = data.write_examples(tmp_path, count=10)
    preprocessing = data.preprocessing()
    assert preprocessing == ImagePreprocessing.from_dict(preprocessing.to_dict())
    assert (preprocessing.image_size, preprocessing.mean, preprocessing.classes[3]) == (8, (0.3,), "3")
    assert len(files) == 10 and len({file.name.split("_")[1] for file in files}) == 10  # one image per class
    for file in files:
        index = int(file.name.split("_")[0])
        image, label = data.test_set[index]
        assert file.name == f"{index:04d}_{label}.png"
        assert torch.equal(preprocessing.load([file])[0], image)


def test_a_larger_image_is_resized_as_training_resizes(tmp_path: Path) -> None:
    from torchvision.io import write_png
    from torchvision.transforms import v2

    big = torch.randint(0, 256, (3, 20, 20), dtype=torch.uint8)
    write_png(big, str(tmp_path / "big.png"))
    preprocessing = ImagePreprocessing(8, 3, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    training = v2.Compose([v2.Resize((8, 8), antialias=True), v2.ToDtype(torch.float32, scale=True),
                           v2.Normalize([0.5] * 3, [0.5] * 3)])  # fmt: skip
    assert torch.equal(preprocessing.load([tmp_path / "big.png"])[0], training(big))
    grey = ImagePreprocessing(8, 1, (0.5,), (0.5,)).read(tmp_path / "big.png")
    assert grey.shape == (1, 8, 8)  # read in the model's channels


def test_inputs_are_a_file_a_folder_or_a_glob_and_nothing_found_is_one_line(tmp_path: Path) -> None:
    for name in ("b.png", "a.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert image_files(str(tmp_path)) == [tmp_path / "a.jpg", tmp_path / "b.png"]
    assert image_files(str(tmp_path / "b.png")) == [tmp_path / "b.png"]
    assert image_files(f"{tmp_path}/*.png") == [tmp_path / "b.png"]
    assert image_files([str(tmp_path / "b.png"), str(tmp_path / "a.jpg")]) == [tmp_path / "b.png", tmp_path / "a.jpg"]
    with pytest.raises(DataError, match="inputs='.*nothing.png' names no image"):
        image_files(str(tmp_path / "nothing.png"))
    with pytest.raises(DataError, match="cannot read '.*a.jpg' as an image"):
        ImagePreprocessing(8, 1, (0.5,), (0.5,)).read(tmp_path / "a.jpg")
    with pytest.raises(DataError, match="mean and std need 3 values each"):
        ImagePreprocessing(8, 3, (0.5,), (0.5,))
