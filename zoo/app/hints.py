"""What zoo suggests next: the command that uses a training run's checkpoint (one per model family), and where
an attention option that cannot go where it was put fits instead (`placement_hint`).

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
from zoo.errors import PlacementError
from zoo.tasks.base import ZooTask
from zoo.tasks.classification import ImageClassificationTask, SequenceClassificationTask
from zoo.tasks.clip import CLIPTask
from zoo.tasks.language_model import LanguageModelTask
from zoo.tasks.masked_lm import MaskedLMTask
from zoo.tasks.translation import RNNTranslationTask, TranslationTask
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


NEEDS = {"bidirectional": "non-causal", "sequence": "token-sequence"}


# The task of every model family (zoo.export.FAMILIES names the families; tests/test_architecture.py keeps the two
# lists the same).
FAMILY_TASKS: tuple[type[ZooTask], ...] = (
    CLIPTask,
    LanguageModelTask,
    MaskedLMTask,
    RNNTranslationTask,
    SequenceClassificationTask,
    TranslationTask,
    ImageClassificationTask,
)


def model_families() -> list[type[ZooTask]]:
    """The task of every model family, by family name."""
    return sorted(FAMILY_TASKS, key=lambda task: task.family)


WHOLE_MODEL = "attention.{option}={value}"  # the override a user types for every attention of a model
HINT_ROOM = 300  # characters of the whole error line: placements are named while they fit


def placement_hint(error: BaseException, target: str | None, name: str | None = None, room: int = 150) -> str:
    """For an attention option that cannot go where it was put (zoo.errors.PlacementError): the placement of
    this model family that takes it, or else the other families where it works, whole models (`model=vit`) first,
    then one attention of a family with its override, as many as fit in `room` characters; "" for any other
    error. `name`: the model= choice the user typed (model=llama is of the gpt family). Reads what each family
    declares (ZooTask.attention_placements), so a new variant or family needs nothing here."""
    if not isinstance(error, PlacementError) or error.needs not in NEEDS:
        return ""
    option, value = error.option, error.value
    family = getattr(task_class(target), "family", None) if target else None
    fitting = {
        task.family: [p for p in task.attention_placements if p.takes(error.needs, option, value)]
        for task in model_families()
    }
    here = fitting.get(family or "", [])
    if here:
        ways = " or ".join(f"{p.command(option, value)} ({p.where})" for p in here)
        return f"; in model={name or family} it fits {ways}"
    whole = [f"model={other}" for other, places in fitting.items() if any(p.override == WHOLE_MODEL for p in places)]
    partial = [
        f"model={other} {places[0].command(option, value)}"
        for other, places in fitting.items()
        if places and not any(p.override == WHOLE_MODEL for p in places)
    ]
    what = f"model={name or family} has no {NEEDS[error.needs]} attention" if family else "it needs another model"
    hint = f"; {what}; {option}={value} fits"
    named = []
    for way in [*whole, *partial]:
        if named and len(hint) + len(", ".join([*named, way])) + 1 > room:
            break
        named.append(way)
    return f"{hint} {', '.join(named)}" if named else f"; {what}"
