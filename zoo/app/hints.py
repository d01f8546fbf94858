"""How a training run ends: the command that uses the checkpoint it just wrote, one per model family.

vit          a test image of each class in <run dir>/examples/, and the `mode=predict` command for them
clip         the same images, and the `mode=zero_shot` command that classifies them by class name
gpt          the `mode=generate` command
translation  the `mode=translate` command
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from zoo.app.pipeline import checkpoint_dir
from zoo.training.checkpoints import task_class


def shown_path(path: Path) -> str:
    """A path as short as it can be said from here (relative when inside the working directory)."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def write_examples(cfg: DictConfig) -> Path | None:
    """<run dir>/examples/: the first test image of each class (image data with class names), else None."""
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    images = datamodule if hasattr(datamodule, "write_examples") else getattr(datamodule, "images", None)
    if not hasattr(images, "write_examples"):
        return None
    folder = Path(cfg.paths.output_dir) / "examples"
    images.write_examples(folder)
    return folder


@rank_zero_only
def next_command(cfg: DictConfig) -> None:
    """The end of a training run: the one command that tries the checkpoint it wrote."""
    checkpoint = checkpoint_dir(cfg) / "last.ckpt"
    family = getattr(task_class(cfg.model._target_), "family", None)
    if not checkpoint.is_file():
        return
    start = f"python run.py model={family} ckpt_path={shown_path(checkpoint)}"
    if family in ("vit", "clip") and (examples := write_examples(cfg)) is not None:
        mode = "predict" if family == "vit" else "zero_shot"
        what = "predict with this model" if family == "vit" else "classify by class name with this model"
        held = f"{examples.name}/ holds a test image of each class"
        print(f"\n{what} ({held}):\n  {start} mode={mode} inputs={shown_path(examples)}")
    elif family == "gpt":
        print(f'\ngenerate text with this model:\n  {start} mode=generate prompt="ROMEO:" max_new_tokens=200')
    elif family == "translation":
        print(f'\ntranslate with this model:\n  {start} mode=translate text="ein Mann fährt Fahrrad."')
