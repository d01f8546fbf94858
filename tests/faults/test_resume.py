"""auto_resume when last.ckpt is corrupt or half-written: it continues from the newest intact checkpoint of the
run, says which one, and ends with exactly the metrics of an uninterrupted run."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.faults.conftest import TINY_VIT, assert_same_metrics, fault, metrics_of, only_run_dir, run
from tests.helpers import compose_config
from zoo.app.pipeline import prepare_checkpoint
from zoo.errors import CheckpointError
from zoo.training.checkpoints import newest_intact_checkpoint
from zoo.weights import read_checkpoint

VIT = "zoo.tasks.classification.ImageClassificationTask"


def write_checkpoints(folder: Path, steps: dict[str, int]) -> dict[str, Path]:
    """Checkpoints named name -> global step, written oldest first (one second apart in mtime)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for age, (name, step) in enumerate(steps.items()):
        path = folder / name
        torch.save({"state_dict": {}, "global_step": step, "zoo": {"task": VIT, "family": "vit"}}, path)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
        paths[name] = path
    return paths


def half_write(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_newest_intact_checkpoint_skips_corrupt_files_and_temporaries(tmp_path: Path) -> None:
    paths = write_checkpoints(
        tmp_path, {"epoch000-step000005.ckpt": 5, "epoch001-step000010.ckpt": 10, "last.ckpt": 15}
    )
    half_write(paths["last.ckpt"])
    (tmp_path / ".last.ckpt.1234.tmp").write_bytes(b"PK half a save")  # a save cut off by a kill
    path, checkpoint = newest_intact_checkpoint(tmp_path)
    assert path == paths["epoch001-step000010.ckpt"] and checkpoint["global_step"] == 10
    paths["epoch001-step000010.ckpt"].write_bytes(b"")
    assert newest_intact_checkpoint(tmp_path)[0] == paths["epoch000-step000005.ckpt"]
    assert newest_intact_checkpoint(tmp_path / "missing") is None


@pytest.mark.parametrize("damage", ["half-written", "corrupt", "missing"])
def test_auto_resume_falls_back_to_the_newest_intact_checkpoint_and_says_which(
    tmp_path: Path, damage: str, caplog
) -> None:
    cfg = compose_config(["model=vit", "auto_resume=true"], tmp_path)
    folder = tmp_path / "checkpoints"
    paths = write_checkpoints(folder, {"epoch000-step000005.ckpt": 5, "last.ckpt": 10})
    {"half-written": half_write, "corrupt": lambda p: p.write_bytes(b"\x00garbage" * 99), "missing": Path.unlink}[
        damage
    ](paths["last.ckpt"])
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert prepare_checkpoint(cfg) == str(paths["epoch000-step000005.ckpt"])
    reason = "missing" if damage == "missing" else "unreadable"
    assert f"auto_resume: last.ckpt is {reason}; resuming from the newest intact checkpoint of the run, " in caplog.text
    assert f"{paths['epoch000-step000005.ckpt']} (step 5)" in caplog.text

    paths["epoch000-step000005.ckpt"].write_bytes(b"")  # nothing left to continue from: one line, no guess
    if damage == "missing":
        write_checkpoints(folder, {"last.ckpt": 10})
        half_write(paths["last.ckpt"])
    with pytest.raises(CheckpointError, match=r"auto_resume: .*last\.ckpt.*no other checkpoint in .* reads whole"):
        prepare_checkpoint(cfg)
    cfg.auto_resume, cfg.ckpt_path = False, str(paths["last.ckpt"])  # a file named by hand is never swapped
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        prepare_checkpoint(cfg)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run SIGKILLed at step 12 (epoch 2, batch 3): its checkpoints are those of steps 5 and 10."""
    root = tmp_path_factory.mktemp("killed")
    code, _, err, _ = run(
        [*TINY_VIT, "logger=csv", f"paths.log_dir={root}", *fault("KillAtStep", root / "fired", step=12)]
    )
    assert code == -9, err[-3000:]
    return only_run_dir(root)


def test_resume_over_a_half_written_last_checkpoint_ends_with_the_uninterrupted_metrics(
    killed_run: Path, reference: dict, tmp_path: Path
) -> None:
    run_dir = tmp_path / "vit" / killed_run.name
    shutil.copytree(killed_run, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)["global_step"] == 10
    half_write(last)
    code, out, err, _ = run([f"auto_resume={run_dir}"])
    assert code == 0, err[-3000:]
    taken = [p for p in (run_dir / "checkpoints").glob("epoch*.ckpt") if f"{p} (step " in out]
    assert "auto_resume: last.ckpt is unreadable; resuming from the newest intact checkpoint" in out, out[-3000:]
    assert len(taken) == 1 and "auto_resume: last.ckpt is unreadable" in (run_dir / "run.log").read_text()
    assert_same_metrics(metrics_of(run_dir), reference)


def test_resuming_a_run_whose_training_is_complete_validates_it_again_and_loses_no_metric(
    reference_run: dict, tmp_path: Path
) -> None:
    # what a sweep trial killed between its last checkpoint and its result is resumed from: fit has nothing to
    # train and runs no validation, yet the trial's objective is a val metric
    run_dir = tmp_path / "vit" / reference_run["run_dir"].name
    shutil.copytree(reference_run["run_dir"], run_dir)
    code, out, err, _ = run([f"auto_resume={run_dir}"])
    assert code == 0, err[-3000:]
    assert "the checkpoint's training is complete, nothing left to train; validating its weights" in out, out[-3000:]
    assert_same_metrics(metrics_of(run_dir), reference_run["metrics"])  # val/* again, train/* kept, test/* again
