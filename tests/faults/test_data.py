"""Faults of the data: a sample that raises or a data-loader worker that dies is one line naming the sample
(split, index, file); an image folder's classes (and the model's num_classes) come from its folder names, and
an empty folder, a class without images or an unreadable image is one line naming the folder or file."""

from __future__ import annotations

from pathlib import Path

import lightning  # noqa: F401  (imported before any test captures stderr: Lightning's log handler keeps its stream)
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.faults.conftest import TINY_VIT
from tests.faults.injection import FaultySamples
from tests.helpers import compose_config, run_in_process
from zoo.app.reporting import user_error_message
from zoo.data.images import ImageFolderDataModule, image_folder_classes
from zoo.data.samples import NamedSamples, lost_worker
from zoo.errors import DataError
from zoo.weights import read_checkpoint

QUIET = [*TINY_VIT, "logger=csv", "trainer.max_epochs=1"]


def samples(how: str, workers: int) -> DataLoader:
    dataset = FaultySamples(TensorDataset(torch.arange(16.0)), index=7, how=how)
    return DataLoader(NamedSamples(dataset, "train", workers), batch_size=4, num_workers=workers)


# -- samples and workers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_that_raises_is_one_line_naming_it(workers: int) -> None:
    with pytest.raises(DataError) as raised:
        list(samples("raise", workers))
    expected = "train sample 7 (digits.npz#7) cannot be loaded (OSError: injected read error in sample 7)"
    assert user_error_message(raised.value) == expected  # a worker's re-raise carries its traceback: cut


def test_a_killed_worker_is_one_line_naming_the_sample_it_was_loading() -> None:
    with pytest.raises(RuntimeError) as raised:
        list(samples("kill", 2))
    line = lost_worker(raised.value)
    assert line is not None and "\n" not in line
    assert "data-loader worker 1 (pid " in line and "while loading train sample 7 (digits.npz#7)" in line, line
    assert "killed" in line or "exited unexpectedly" in line
    assert lost_worker(RuntimeError("something else")) is None
    # A loader whose dataset does not record what it loads (in-memory tokens): the worker, without a sample.
    unnamed = lost_worker(RuntimeError("DataLoader worker (pid(s) 999999) exited unexpectedly"))
    assert unnamed == "a data-loader worker (pid 999999) exited unexpectedly " + (
        "(killed for memory? try fewer data.num_workers or a smaller data.batch_size)"
    )


@pytest.mark.parametrize(("fault", "workers", "status"), [("raise", 0, 2), ("kill", 2, 3)])
def test_a_run_with_a_faulty_sample_stops_with_one_line(fault: str, workers: int, status: int, tmp_path, capsys):
    data = [
        "data._target_=tests.faults.injection.FaultyDigits",
        f"+data.fault={fault}",
        "+data.fault_index=5",
        f"data.num_workers={workers}",
        "data.batch_size=1200",
    ]  # fmt: skip  (one batch holds sample 5)
    code, out, err = run_in_process([*QUIET, *data, f"paths.log_dir={tmp_path}"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == status and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "train sample 5 (digits.npz#5)" in lines[0], lines[0]


# -- image folders -----------------------------------------------------------------------------------------
def image_folder(root: Path, classes: dict[str, int], size: int = 12) -> Path:
    from torchvision.io import write_png

    generator = torch.Generator().manual_seed(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image = torch.randint(0, 255, (3, size, size), dtype=torch.uint8, generator=generator)
            write_png(image, str(root / name / f"{i}.png"))
    return root


def test_classes_and_the_models_num_classes_come_from_the_folder_names(tmp_path: Path) -> None:
    flat = image_folder(tmp_path / "flat", {"cat": 5, "dog": 5, "owl": 5})
    split = tmp_path / "split"
    image_folder(split / "train", {"ant": 6, "bee": 6})
    image_folder(split / "test", {"ant": 2, "bee": 2})
    assert image_folder_classes(flat) == ["cat", "dog", "owl"] and image_folder_classes(split) == ["ant", "bee"]
    for folder, count in ((flat, 3), (split, 2)):
        cfg = compose_config(["model=vit", "data=image_folder", f"data.data_dir={folder}"], tmp_path)
        assert cfg.data.num_classes == count and cfg.model.net.num_classes == count
    module = ImageFolderDataModule(data_dir=str(split), image_size=8, batch_size=4, val_fraction=0.25)
    module.setup()
    assert module.classes == ("ant", "bee") and len(module.test_set) == 4
    assert module.test_set.sample_source(0) == str(split / "test" / "ant" / "0.png")


def test_training_on_an_image_folder_builds_the_head_from_its_classes(tmp_path: Path, capsys) -> None:
    folder = image_folder(tmp_path / "images", {"cat": 8, "dog": 8, "owl": 8})
    args = [*QUIET, "data=image_folder", f"data.data_dir={folder}", "data.image_size=8", "data.num_workers=0",
            "data.batch_size=4", "data.val_fraction=0.25", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, err[-3000:]
    head = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["state_dict"]["net.head.weight"]
    assert head.shape == (3, 16)


def broken_folders(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (data_dir, what the error line must say)."""
    (root / "empty").mkdir(parents=True)
    no_images = image_folder(root / "no_images", {"cat": 3})
    (no_images / "dog").mkdir()
    (no_images / "dog" / "notes.txt").write_text("not an image")
    unreadable = image_folder(root / "unreadable", {"cat": 3, "dog": 3})
    (unreadable / "dog" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n but cut off")
    split = image_folder(root / "split" / "train", {"cat": 3, "dog": 3}).parent
    image_folder(split / "test", {"cat": 2, "cow": 2})
    return {
        "empty folder": (root / "empty", f"image folder {root / 'empty'} has no class folders"),
        "class without images": (no_images, f"class folder {no_images / 'dog'} holds no images"),
        "unreadable image": (unreadable, f"cannot read image {unreadable / 'dog' / '3.png'}"),
        "test classes differ": (split, f"{split / 'test'} has classes ['cat', 'cow'], but {split / 'train'} has"),
    }


@pytest.mark.parametrize("case", ["empty folder", "class without images", "unreadable image", "test classes differ"])
def test_a_broken_image_folder_is_one_line_naming_the_folder_or_file(case: str, tmp_path: Path, capsys) -> None:
    data_dir, expected = broken_folders(tmp_path / "data")[case]
    args = [*QUIET, "data=image_folder", f"data.data_dir={data_dir}", "data.image_size=8", "data.num_workers=0",
            f"paths.log_dir={tmp_path / 'outputs'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert expected in lines[0], lines[0]
    assert not list((tmp_path / "outputs").rglob("run.log"))  # the run never started: no folder left behind


def test_an_explicit_num_classes_must_match_the_folders(tmp_path: Path) -> None:
    folder = image_folder(tmp_path / "images", {"cat": 3, "dog": 3})
    with pytest.raises(DataError, match=r"data.num_classes=5, but .* has 2 class folders \['cat', 'dog'\]"):
        ImageFolderDataModule(data_dir=str(folder), image_size=8, num_classes=5).setup()
