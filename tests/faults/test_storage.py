"""A disk that fills up or turns read-only under a run: one line naming the folder, its free space and the last
good checkpoint (exit status 3), nothing written before is lost, and a resume once the disk is fixed ends with
exactly the metrics of an uninterrupted run.

The disk is a small tmpfs mounted for the test (real ENOSPC and EROFS); without the rights to mount one, the
fault is injected into zoo's checkpoint writer instead (the same errno, raised by torch.save). A file system
cannot be remounted read-only while a run has files open on it, so the real read-only disk is met by the
checkpoint writer and by a resume.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import lightning  # noqa: F401  (imported before any test captures stderr: Lightning's log handler keeps its stream)
import pytest
import torch

import zoo.app.job
import zoo.training.checkpoints
from tests.faults.conftest import TINY_VIT, assert_same_metrics, error_lines, fault, metrics_of, only_run_dir, run
from tests.helpers import run_in_process
from zoo.errors import MachineFault, storage_failure, storage_message
from zoo.training.checkpoints import AtomicCheckpointIO
from zoo.weights import read_checkpoint


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[bool]:
    """A tmpfs of `size` at `folder` while inside; yields False (and mounts nothing) where mounting is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    with tmpfs(tmp_path / "disk", "8m") as mounted:
        yield tmp_path / "disk", mounted


# -- the checkpoint writer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["full", "read-only"])
def test_a_refused_checkpoint_write_is_one_line_and_keeps_the_last_good_checkpoint(disk, how, monkeypatch) -> None:
    folder, mounted = disk
    io, last = AtomicCheckpointIO(), folder / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 3}, last)
    if mounted:
        fill(folder) if how == "full" else remount(folder, "ro")
    else:
        code = errno.ENOSPC if how == "full" else errno.EROFS

        def refuse(*args, **kwargs):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(zoo.training.checkpoints.torch, "save", refuse)
    with pytest.raises(MachineFault) as raised:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 4}, last)
    message = str(raised.value)
    reason = "no space left on device" if how == "full" else "read-only file system"
    assert "\n" not in message and f"cannot write {last}: {reason}" in message
    assert f"free of 8.4 MB in {last.parent})" in message or not mounted
    assert f"the last good checkpoint is kept: {last} (step 3)" in message
    if mounted and how == "full":
        assert "(0 B free" in message
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind
    assert torch.equal(read_checkpoint(last)["state_dict"]["w"], torch.ones(3))
    if mounted and how == "read-only":
        remount(folder, "rw")


# -- a real run ---------------------------------------------------------------------------------------------
def test_a_run_on_a_full_disk_stops_with_one_line_and_resumes_exactly_once_space_is_freed(
    disk, reference, tmp_path
) -> None:
    folder, mounted = disk
    faulty = fault("StorageFaultAtStep", tmp_path / "fired", step=12, how="fill" if mounted else "enospc", mount=folder)
    code, out, err, _ = run([*TINY_VIT, f"paths.log_dir={folder}", *faulty])
    run_dir = only_run_dir(folder)
    checkpoints = run_dir / "checkpoints"
    assert code == 3, err[-3000:]
    assert "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
    line = error_lines(err)[0]
    assert f"cannot write {checkpoints}" in line and "no space left on device" in line and "free of" in line, line
    assert f"the last good checkpoint is kept: {checkpoints / 'last.ckpt'} (step 10)" in line, line
    assert line.endswith(f"once fixed, resume with: python run.py auto_resume={run_dir}"), line
    # Nothing written before the fault is lost: the checkpoints of steps 5 and 10 read whole, no temporaries.
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 10
    assert all(read_checkpoint(p)["global_step"] in (5, 10) for p in checkpoints.glob("*.ckpt"))
    assert not list(checkpoints.glob(".*.tmp")) and (run_dir / ".hydra" / "config.yaml").is_file()

    if mounted:
        (folder / "filler").unlink()  # space is freed
        remount(folder, "ro")  # but the disk is read-only now: the resume is refused in one line, harmlessly
        code, _, err, _ = run([f"auto_resume={run_dir}"])
        assert code == 3 and len(error_lines(err)) == 1 and "Traceback" not in err, err[-3000:]
        assert f"cannot write {run_dir}" in error_lines(err)[0] and "read-only file system" in error_lines(err)[0]
        remount(folder, "rw")
    code, _, err, _ = run([f"auto_resume={run_dir}"])
    assert code == 0, err[-3000:]
    assert_same_metrics(metrics_of(run_dir), reference)


def test_a_full_disk_met_outside_the_checkpoint_writer_names_the_last_good_checkpoint_too(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    def full_disk(cfg, metrics) -> None:  # the disk fills up after training, as metrics.json is written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(cfg.paths.output_dir) / "metrics.json"))

    monkeypatch.setattr(zoo.app.job, "report", full_disk)
    run_dir = tmp_path / "vit" / "run"
    code, out, err = run_in_process(
        [*TINY_VIT, "trainer.max_epochs=1", "logger=csv", f"hydra.run.dir={run_dir}"], capsys
    )
    assert code == 3 and len(error_lines(err)) == 1 and "Traceback" not in err, err[-3000:]
    line = error_lines(err)[0]
    assert f"error: cannot write {run_dir / 'metrics.json'}: no space left on device (" in line, line
    assert re.search(
        rf"; the last good checkpoint is kept: {re.escape(str(run_dir))}/checkpoints/\S+ \(step 5\);", line
    )
    assert line.endswith(f"; once fixed, resume with: python run.py auto_resume={run_dir}"), line


def test_storage_failures_are_found_behind_the_errors_that_carry_them(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.ckpt"))
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as wrapped:  # what torch's zip writer raises on a full disk: the OSError is its context
        assert storage_failure(wrapped) is full
    assert storage_failure(FileNotFoundError(errno.ENOENT, "missing")) is None  # bad input, not a fault
    assert storage_message(full).startswith(f"cannot write {tmp_path / 'x.ckpt'}: no space left on device (")
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path))
    assert storage_message(denied).startswith(f"cannot access {tmp_path}: permission denied (")
