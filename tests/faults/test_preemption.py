"""Preemption as SLURM does it: SIGUSR1 (`sbatch --signal=USR1@90`, the warning before the time limit) or SIGTERM
saves a resumable last.ckpt at the next batch boundary and exits 128 + the signal; under SLURM (Lightning's
SLURMEnvironment, auto_requeue) SIGUSR1 also requeues the job, and the requeued start continues the run.

SLURM itself is not here: its environment variables and a stand-in `scontrol` on PATH (which records how it was
called) are. The signal comes from inside the run, at a chosen step (tests.faults.injection.SignalAtStep)."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import lightning  # noqa: F401  (imported before any test captures stderr: Lightning's log handler keeps its stream)
import pytest
import torch

from tests.faults.conftest import TINY_VIT, fault
from tests.helpers import run_in_process
from zoo.weights import read_checkpoint

QUIET = [*TINY_VIT, "logger=csv", "trainer.max_epochs=3"]


@pytest.fixture
def loads(monkeypatch) -> list[dict]:
    """Every torch.load of the run, with its keyword arguments."""
    calls: list[dict] = []
    real = torch.load

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording)
    return calls


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch) -> Path:
    """A SLURM batch job's environment and a stand-in scontrol; returns the file scontrol writes its arguments to."""
    calls = tmp_path / "scontrol.calls"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    for name, value in {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "zoo", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    return calls


def test_sigusr1_outside_slurm_saves_a_resumable_checkpoint_and_exits_138(tmp_path: Path, capsys) -> None:
    # SIGTERM takes the same path, exit 143 (tests/test_reliability.py).
    run_dir = tmp_path / "vit" / "job"
    args = [*QUIET, f"hydra.run.dir={run_dir}", *fault("SignalAtStep", tmp_path / "fired", step=7, signum="SIGUSR1")]
    code, out, err = run_in_process(args, capsys)
    assert code == 128 + signal.SIGUSR1, err[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    note = "not requeued (not under SLURM with auto_requeue); resume with"
    assert f"interrupted by SIGUSR1 at step 8: saved {last}; {note}: python run.py ckpt_path={last}" in err
    saved = read_checkpoint(last)
    assert saved["global_step"] == 8 and "rng" in saved["callbacks"]["ResumeState"]
    assert "optimizer_states" in saved  # the whole training state, not only the weights
    printed = out + err + (run_dir / "run.log").read_text()
    assert "`weights_only` was not set" not in printed  # Lightning's note on saving without weights_only=False


def test_under_slurm_sigusr1_requeues_the_job_and_the_requeued_start_continues(tmp_path, capsys, slurm, loads) -> None:
    # The sbatch script's command: a run directory named after the job, and auto_resume=true.
    command = [*QUIET, "hydra.run.dir=" + str(tmp_path / "vit" / "slurm-4242"), "auto_resume=true"]
    code, out, err = run_in_process(
        [*command, *fault("SignalAtStep", tmp_path / "fired", step=7, signum="SIGUSR1")], capsys
    )
    assert code == 128 + signal.SIGUSR1, err[-3000:]
    last = tmp_path / "vit" / "slurm-4242" / "checkpoints" / "last.ckpt"
    assert slurm.read_text().split() == ["requeue", "4242"]
    assert f"interrupted by SIGUSR1 at step 8: saved {last}; requeued SLURM job 4242" in err
    assert read_checkpoint(last)["global_step"] == 8

    loads.clear()
    code, out, err = run_in_process(command, capsys)  # SLURM starts the same script again
    assert code == 0, err[-3000:]
    assert f"resuming from {last}" in (last.parent.parent / "run.log").read_text()
    assert read_checkpoint(last)["global_step"] == 15  # trained to the end: 3 epochs of 5 batches
    assert slurm.read_text().split() == ["requeue", "4242"]  # requeued once, by the signal only
    assert loads and all(call.get("weights_only") is True for call in loads)  # every read of the resume
