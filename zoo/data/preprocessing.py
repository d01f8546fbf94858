"""What a trained image model needs to see new images as it saw its evaluation data: size, channels,
normalisation and class names. The data modules describe themselves with it (`preprocessing()`), tasks store
it in every checkpoint as a plain dict, and `zoo.load` / `mode=predict` read images through it. Pure torch
and torchvision: no Lightning.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torchvision.transforms import v2

from zoo.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class ImagePreprocessing:
    """Evaluation transform of zoo's image data modules: uint8 image -> resize to image_size (antialiased,
    only when the size differs) -> float in [0, 1] -> (x - mean) / std per channel."""

    image_size: int
    in_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.mean, self.std, self.classes = tuple(self.mean), tuple(self.std), tuple(self.classes)
        if self.in_channels not in (1, 3):
            raise DataError(f"image preprocessing needs 1 or 3 channels, got in_channels={self.in_channels}")
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise DataError(f"mean and std need {self.in_channels} values each, got {self.mean} and {self.std}")

    def resize(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (C, H, W) -> uint8 (C, image_size, image_size)."""
        if tuple(image.shape[-2:]) == (self.image_size, self.image_size):
            return image
        return v2.functional.resize(image, [self.image_size, self.image_size], antialias=True)

    def normalize(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (..., C, H, W) of the model's size -> the float tensor the model reads."""
        image = v2.functional.to_dtype(image, torch.float32, scale=True)
        return v2.functional.normalize(image, list(self.mean), list(self.std))

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (C, H, W) of any size -> float (C, image_size, image_size): what training evaluated on."""
        return self.normalize(self.resize(image))

    def read(self, path: str | Path) -> torch.Tensor:
        """An image file as uint8 (C, image_size, image_size), in the model's channels (grey or RGB)."""
        from torchvision.io import ImageReadMode, decode_image

        mode = ImageReadMode.RGB if self.in_channels == 3 else ImageReadMode.GRAY
        try:
            image = decode_image(str(path), mode=mode)
        except Exception as error:
            raise DataError(f"cannot read {str(path)!r} as an image ({type(error).__name__})") from None
        return self.resize(image)

    def load(self, paths: Sequence[str | Path]) -> torch.Tensor:
        """Image files -> the batch (N, C, image_size, image_size) the model reads."""
        return torch.stack([self.normalize(self.read(path)) for path in paths])

    def to_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ImagePreprocessing:
        return cls(**values)


def image_files(inputs: str | Sequence[str], key: str = "inputs") -> list[Path]:
    """`inputs` (an image file, a folder of images, a glob, or a list of those) -> the image files, sorted
    within each entry; a one-line DataError when nothing is found."""
    entries = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if not entries:
        raise DataError(f"{key} is empty; give an image file, a folder of images or a glob such as 'images/*.png'")
    found: list[Path] = []
    for entry in entries:
        path = Path(str(entry)).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif path.is_file():
            files = [path]
        else:
            files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(
                f"{key}={str(entry)!r} names no image: give an image file, a folder of images or a glob "
                f"(image files end in {', '.join(IMAGE_SUFFIXES)})"
            )
        found.extend(files)
    return found
