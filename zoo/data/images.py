"""Image-classification data modules: digits (embedded), MNIST, Fashion-MNIST, CIFAR-10, image folders.

Every module yields (image float (C, H, W), label int) batches, has `classes` (names, used by CLIP's
prompt captions), and splits deterministically: test = the dataset's own test split, val = a seeded
stratified `val_fraction` of the training split.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from zoo.data.preprocessing import ImagePreprocessing
from zoo.data.samples import NamedSamples
from zoo.data.splits import SplitDataModule
from zoo.errors import DataError, one_line

# Deterministic transforms of a split whose output fits this size run once, on the whole tensor, in setup:
# per sample they cost a noticeable share of a small ViT's step (figures in experiments/results/recipes.md).
PRECOMPUTE_BYTES = 512 * 2**20


class TensorImageDataset(Dataset):
    """uint8 images (N, C, H, W) and int64 labels (N,) with a per-sample transform; `sources` names the file
    of each image (image folders), for messages about a sample. `deterministic`: the transform draws nothing
    at random, so it is applied to all images at once here (when its output fits PRECOMPUTE_BYTES);
    `images` stays the uint8 originals either way."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Any = None,
        sources: Sequence[str] | None = None,
        deterministic: bool = False,
    ) -> None:
        self.images, self.labels, self.transform = images, labels, transform
        self.sources = sources
        self.prepared: torch.Tensor | None = None  # the transformed images, when computed up front
        if deterministic and transform is not None and len(images):
            first = transform(images[:1])  # a resize can make the output far larger than the uint8 input
            if first.numel() * first.element_size() * len(images) <= PRECOMPUTE_BYTES:
                self.prepared = torch.cat([transform(chunk) for chunk in images.split(4096)])

    def sample_source(self, index: int) -> str | None:
        return self.sources[index] if self.sources is not None else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.prepared is not None:
            return self.prepared[index], int(self.labels[index])
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


class RandomCropFlip(torch.nn.Module):
    """torchvision's `RandomCrop(size, padding)` (offsets drawn uniformly in [0, 2 * padding], the border black)
    and, with `flip`, `RandomHorizontalFlip()`, drawn per image, on a whole normalised float batch at once (one
    gather): in the training process after the batch is loaded, not per sample in data workers.

    `fill` is the value a black pixel has after normalisation, per channel: the border matches torchvision's,
    which pads the uint8 image before normalising it. Fashion-MNIST's recipe: per-sample transforms in two
    data workers made an epoch much slower than its training steps on 2 cores (figures in recipes.md)."""

    def __init__(self, padding: int, flip: bool, fill: Sequence[float]) -> None:
        super().__init__()
        self.padding, self.flip = padding, flip
        self.register_buffer("fill", torch.tensor(fill, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b, c, h, w = images.shape
        p = self.padding
        padded = self.fill.to(images).expand(b, c, h + 2 * p, w + 2 * p).clone()
        padded[..., p : p + h, p : p + w] = images
        rows = torch.randint(0, 2 * p + 1, (b, 1), device=images.device) + torch.arange(h, device=images.device)
        cols = torch.randint(0, 2 * p + 1, (b, 1), device=images.device) + torch.arange(w, device=images.device)
        if self.flip:
            mirrored = torch.rand(b, 1, device=images.device) < 0.5
            cols = torch.where(mirrored, cols.flip(1), cols)
        batch = torch.arange(b, device=images.device)[:, None, None]
        return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


class ImageClassificationDataModule(SplitDataModule):
    """Base: subclasses implement `load()` -> (train_images, train_labels, test_images, test_labels) as
    uint8 (N, C, H, W) / int64 tensors, and set `classes`, `mean`, `std`."""

    classes: tuple[str, ...] = ()
    # The file of every (train, test) image, in load() order; None when the images come from one archive.
    sources: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None)
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    default_augment: tuple = ()

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        seed: int = 0,
        image_size: int | None = None,
        in_channels: int | None = None,
        num_classes: int | None = None,
        patch_size: int | None = None,
        augment: bool = True,
        download: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise DataError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        if batch_size <= 0:
            raise DataError(f"data.batch_size must be a positive int, got {batch_size}")
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.image_size = image_size
        self.in_channels = in_channels
        self.num_classes = num_classes
        # The ViT patch size that suits this dataset (models read ${data.patch_size}).
        if patch_size is not None and image_size is not None and (patch_size <= 0 or image_size % patch_size):
            raise DataError(
                f"image size must be divisible by patch size, got data.image_size={image_size} and "
                f"data.patch_size={patch_size}"
            )
        self.patch_size = patch_size
        self.augment = augment
        self.download = download
        self.train_set = self.val_set = self.test_set = None
        self.train_augment: torch.nn.Module | None = None  # batch_augmentation(), with augment on

    # -- subclass API ---------------------------------------------------------------------------
    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def augmentations(self) -> list:
        """Training-only transforms on uint8 tensors, per sample; the dataset's standard recipe."""
        return list(self.default_augment)

    def batch_augmentation(self) -> torch.nn.Module | None:
        """The dataset's standard training augmentation as one module on whole normalised batches (applied in
        `on_after_batch_transfer`), instead of `augmentations()`; None: none."""
        return None

    def black(self) -> list[float]:
        """A black pixel after normalisation, per channel (the padding of a random crop)."""
        return ((torch.zeros(len(self.mean)) - torch.tensor(self.mean)) / torch.tensor(self.std)).tolist()

    # -- Lightning -------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_images, train_labels, test_images, test_labels = self.load()
        self._check_metadata(train_images, train_labels)
        train_sources, test_sources = self.sources
        train_idx, val_idx = train_test_split(
            np.arange(len(train_labels)),
            test_size=self.val_fraction,
            random_state=self.seed,
            stratify=train_labels.numpy(),
        )
        train_idx, val_idx = torch.as_tensor(np.sort(train_idx)), torch.as_tensor(np.sort(val_idx))
        resize = (
            [v2.Resize((self.image_size, self.image_size), antialias=True)] if self._needs_resize(train_images) else []
        )
        to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        self.train_augment = self.batch_augmentation() if self.augment else None
        per_sample = self.augmentations() if self.augment and self.train_augment is None else []
        train_tf = v2.Compose(resize + per_sample + to_float)
        eval_tf = v2.Compose(resize + to_float)
        picked = lambda sources, idx: [sources[i] for i in idx.tolist()] if sources is not None else None
        train_names = picked(train_sources, train_idx)
        self.train_set = TensorImageDataset(
            train_images[train_idx], train_labels[train_idx], train_tf, train_names, deterministic=not per_sample
        )
        self.val_set = TensorImageDataset(
            train_images[val_idx], train_labels[val_idx], eval_tf, picked(train_sources, val_idx), deterministic=True
        )
        self.test_set = TensorImageDataset(test_images, test_labels, eval_tf, test_sources, deterministic=True)

    def preprocessing(self) -> ImagePreprocessing:
        """What the evaluation transform does (stored in checkpoints, so a trained model reads new images the same
        way); the image size is the data's own where data.image_size is not set."""
        size = self.image_size or (int(self.test_set.images.shape[-1]) if self.test_set is not None else None)
        channels = self.in_channels or (int(self.test_set.images.shape[1]) if self.test_set is not None else None)
        if size is None or channels is None:
            raise DataError(f"{type(self).__name__}: set data.image_size and data.in_channels, or call setup() first")
        return ImagePreprocessing(size, channels, self.mean, self.std, tuple(self.classes))

    def write_examples(self, folder: str | Path, count: int = 10) -> list[Path]:
        """The first test image of each class (up to `count`) as PNG files <index>_<class>.png, exactly the
        pixels the test split holds: what `mode=predict` can be tried on."""
        from torchvision.io import write_png

        self.setup()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written, seen = [], set()
        for index, label in enumerate(self.test_set.labels.tolist()):
            if label in seen:
                continue
            seen.add(label)
            name = self.classes[label] if label < len(self.classes) else str(label)
            path = folder / f"{index:04d}_{''.join(c if c.isalnum() else '-' for c in name)}.png"
            write_png(self.test_set.images[index].contiguous(), str(path))
            written.append(path)
            if len(written) == count:
                break
        return written

    def _needs_resize(self, images: torch.Tensor) -> bool:
        return self.image_size is not None and tuple(images.shape[-2:]) != (self.image_size, self.image_size)

    def _check_metadata(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        name = type(self).__name__
        if self.in_channels is not None and images.shape[1] != self.in_channels:
            raise DataError(f"{name} has {images.shape[1]} channels, but data.in_channels={self.in_channels}")
        found = int(labels.max()) + 1
        if self.num_classes is not None and found > self.num_classes:
            raise DataError(f"{name} has {found} classes, but data.num_classes={self.num_classes}")

    def loader(self, split: str) -> DataLoader:
        return DataLoader(
            NamedSamples(getattr(self, f"{split}_set"), split, self.num_workers),  # a failing sample is named
            batch_size=self.batch_size_of(split),
            shuffle=split == "train",
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            drop_last=False,
        )

    def augment_batch(self, images: torch.Tensor, training: bool) -> torch.Tensor:
        """`train_augment` on a training batch's images (on their device); evaluation batches pass as they are."""
        if self.train_augment is None or not training:
            return images
        return self.train_augment.to(images.device)(images)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        images, labels = batch
        return self.augment_batch(images, self.trainer is not None and self.trainer.training), labels


class DigitsDataModule(ImageClassificationDataModule):
    """scikit-learn's bundled 8x8 digits (1,797 images): no download, the embedded default.
    Test = a stratified 20% hold-out (360 images), as in scikit-learn's own example."""

    classes = tuple(str(d) for d in range(10))
    mean, std = (0.3,), (0.38,)

    def __init__(self, test_fraction: float = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.test_fraction = test_fraction

    def augmentations(self) -> list:
        # Shifts of up to one pixel, inside the frame. Off by default (data.augment=false): on 8x8 digits any
        # shift costs test accuracy (ViT default recipe over seeds; rotations, scaling and wrap-around shifts cost
        # more; figures in experiments/results/recipes.md).
        return [v2.RandomAffine(degrees=0, translate=(0.125, 0.125))]

    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.from_numpy(np.round(digits.images * (255.0 / 16.0)).astype(np.uint8))[:, None]
        labels = torch.from_numpy(digits.target.astype(np.int64))
        train_idx, test_idx = train_test_split(
            np.arange(len(labels)), test_size=self.test_fraction, random_state=0, stratify=digits.target
        )
        train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
        return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (LeCun's MNIST format), plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise DataError(f"{path} is truncated: expected {int(np.prod(shape))} values, found {array.size}")
    return array.reshape(shape)


class MNISTLikeDataModule(ImageClassificationDataModule):
    """MNIST-format data (idx files). Reads `data_dir` holding the four idx files (plain or .gz, e.g.
    Debian's /usr/share/datasets/fashion-mnist) or torchvision's layout <data_dir>/<Name>/raw; otherwise
    downloads with torchvision when online."""

    torchvision_name = "MNIST"
    files = {
        "train_images": "train-images-idx3-ubyte",
        "train_labels": "train-labels-idx1-ubyte",
        "test_images": "t10k-images-idx3-ubyte",
        "test_labels": "t10k-labels-idx1-ubyte",
    }

    def batch_augmentation(self) -> torch.nn.Module:
        return RandomCropFlip(padding=2, flip=False, fill=self.black())

    def _find(self, root: Path) -> dict[str, Path] | None:
        for folder in (root, root / self.torchvision_name / "raw"):
            found = {}
            for key, stem in self.files.items():
                for candidate in (folder / stem, folder / f"{stem}.gz"):
                    if candidate.is_file():
                        found[key] = candidate
                        break
            if len(found) == len(self.files):
                return found
        return None

    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        root = Path(self.data_dir or "data").expanduser()
        found = self._find(root)
        if found is None and self.download:
            import torchvision.datasets as tv_datasets

            try:
                getattr(tv_datasets, self.torchvision_name)(str(root), train=True, download=True)
                getattr(tv_datasets, self.torchvision_name)(str(root), train=False, download=True)
            except Exception as error:  # offline, proxy, disk: all end in the same advice
                raise DataError(
                    f"{self.torchvision_name} is not in data.data_dir={str(root)!r} and could not be downloaded "
                    f"({type(error).__name__}); point data.data_dir at a folder with the four idx files"
                    f"{self.debian_hint()}"
                ) from None
            found = self._find(root)
        if found is None:
            raise DataError(
                f"{self.torchvision_name} idx files not found in data.data_dir={str(root)!r} (download disabled); "
                f"expected {sorted(self.files.values())}{self.debian_hint()}"
            )
        arrays = {key: torch.from_numpy(read_idx(path).copy()) for key, path in found.items()}
        return (
            arrays["train_images"][:, None],
            arrays["train_labels"].long(),
            arrays["test_images"][:, None],
            arrays["test_labels"].long(),
        )

    def debian_hint(self) -> str:
        return ""


class MNISTDataModule(MNISTLikeDataModule):
    torchvision_name = "MNIST"
    classes = tuple(str(d) for d in range(10))
    mean, std = (0.1307,), (0.3081,)


class FashionMNISTDataModule(MNISTLikeDataModule):
    torchvision_name = "FashionMNIST"
    classes = ("T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
    mean, std = (0.2860,), (0.3530,)

    def batch_augmentation(self) -> torch.nn.Module:
        return RandomCropFlip(padding=2, flip=True, fill=self.black())

    def debian_hint(self) -> str:
        return " (Debian: apt-get install dataset-fashion-mnist, then data.data_dir=/usr/share/datasets/fashion-mnist)"


class CIFAR10DataModule(ImageClassificationDataModule):
    """CIFAR-10 through torchvision: reads <data_dir>/cifar-10-batches-py, downloads when online."""

    classes = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

    def batch_augmentation(self) -> torch.nn.Module:
        return RandomCropFlip(padding=(self.image_size or 32) // 8, flip=True, fill=self.black())

    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        from torchvision.datasets import CIFAR10

        root = str(Path(self.data_dir or "data").expanduser())
        try:
            train = CIFAR10(root, train=True, download=self.download)
            test = CIFAR10(root, train=False, download=self.download)
        except Exception as error:
            raise DataError(
                f"CIFAR-10 is not in data.data_dir={root!r} and could not be downloaded ({type(error).__name__}); "
                "point data.data_dir at a folder holding cifar-10-batches-py"
            ) from None

        def tensors(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(ds.targets)

        return (*tensors(train), *tensors(test))


def image_folder_classes(data_dir: str | Path) -> list[str]:
    """The class names of an image folder (its train/ split's, for data_dir/{train,test}/<class>/...), sorted:
    what data=image_folder infers data.num_classes from. One DataError for a missing or empty folder, or a class
    folder without images."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data.data_dir must be an existing folder of <class>/<image> files, got {str(data_dir)!r}")
    folder = root / "train" if (root / "train").is_dir() and (root / "test").is_dir() else root
    return scan_image_folder(folder)[0]


def scan_image_folder(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names, [(image file, label)]) of <folder>/<class>/<image>: torchvision's ImageFolder layout and
    extensions, classes sorted by name. An empty folder or a class without images is one DataError."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(
            f"image folder {folder} has no class folders; expected {folder}/<class>/<image>, one sub-folder of "
            "images per class"
        )
    samples = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (folder / name).rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
        if not files:
            raise DataError(
                f"class folder {folder / name} holds no images (extensions {', '.join(IMG_EXTENSIONS)}); add images "
                "or remove the folder"
            )
        samples += [(file, label) for file in files]
    return classes, samples


class ImageFolderDataModule(ImageClassificationDataModule):
    """Your own images: <data_dir>/<class>/<image> (torchvision ImageFolder's layout). With train/ and test/
    subfolders those are the splits; otherwise a seeded 20% of the images is the test split. The classes are
    the folder names (data.num_classes counts them: conf/data/image_folder.yaml); every image is decoded
    up front, so an unreadable file is named before training starts."""

    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

    def augmentations(self) -> list:
        return [v2.RandomHorizontalFlip()]

    def load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_image

        if not self.data_dir or not Path(self.data_dir).is_dir():
            raise DataError(f"data.data_dir must be an existing folder of <class>/<image> files, got {self.data_dir!r}")
        if self.image_size is None:
            raise DataError("data.image_size must be set for image_folder (images are resized to it)")
        root = Path(self.data_dir)
        mode = ImageReadMode.RGB if (self.in_channels or 3) == 3 else ImageReadMode.GRAY
        resize = v2.Resize((self.image_size, self.image_size), antialias=True)

        def decode(path: Path) -> torch.Tensor:
            try:
                return resize(decode_image(str(path), mode=mode))
            except Exception as error:
                raise DataError(
                    f"cannot read image {path} ({type(error).__name__}: {one_line(error)}); fix or remove the file"
                ) from None

        def read(folder: Path) -> tuple[torch.Tensor, torch.Tensor, list[str], list[str]]:
            classes, samples = scan_image_folder(folder)
            images = torch.stack([decode(path) for path, _ in samples])
            return images, torch.tensor([label for _, label in samples]), classes, [str(p) for p, _ in samples]

        if (root / "train").is_dir() and (root / "test").is_dir():
            train_images, train_labels, classes, train_files = read(root / "train")
            test_images, test_labels, test_classes, test_files = read(root / "test")
            if test_classes != classes:
                raise DataError(
                    f"{root / 'test'} has classes {test_classes}, but {root / 'train'} has {classes}; give both "
                    "splits the same class folders"
                )
        else:
            images, labels, classes, files = read(root)
            too_few = [name for label, name in enumerate(classes) if int((labels == label).sum()) < 2]
            if too_few:
                raise DataError(
                    f"class folder {root / too_few[0]} holds 1 image; a split into train and test needs at least 2 "
                    "per class"
                )
            train_idx, test_idx = train_test_split(
                np.arange(len(labels)), test_size=0.2, random_state=0, stratify=labels
            )
            train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
            train_images, train_labels = images[train_idx], labels[train_idx]
            test_images, test_labels = images[test_idx], labels[test_idx]
            train_files, test_files = [files[i] for i in train_idx], [files[i] for i in test_idx]
        if self.num_classes is not None and self.num_classes != len(classes):
            raise DataError(
                f"data.num_classes={self.num_classes}, but {root} has {len(classes)} class folders {classes}; leave "
                "data.num_classes at its default (counted from the folders)"
            )
        self.classes = tuple(classes)
        self.sources = (train_files, test_files)
        return train_images, train_labels, test_images, test_labels
