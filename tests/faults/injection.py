"""Faults a test injects into a real `python run.py` through the command line, e.g.
`+callbacks.fault._target_=tests.faults.injection.KillAtStep +callbacks.fault.step=7 ...`.

Each fault fires once: it first writes `marker` (a file outside the run directory), and a process that finds the
marker does nothing. A resumed run inherits the faulty run's overrides (auto_resume) and so trains on.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import lightning as L
import torch

import zoo.training.checkpoints
from zoo.data.images import DigitsDataModule


def fire_once(marker: str) -> bool:
    """True the first time (and writes the marker), False afterwards."""
    try:
        with open(marker, "x"):
            return True
    except FileExistsError:
        return False


class FaultAtStep(L.Callback):
    """Base: `fault(trainer)` at the start of training step `step` on rank `rank`, once."""

    def __init__(self, step: int, marker: str, rank: int = 0) -> None:
        self.step, self.marker, self.rank = step, marker, rank

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank and fire_once(self.marker):
            self.fault(trainer)

    def fault(self, trainer: L.Trainer) -> None:
        raise NotImplementedError


class KillAtStep(FaultAtStep):
    """The process of rank `rank` is killed with `signum` (SIGKILL: no handler, no cleanup; SIGSTOP: it hangs)."""

    def __init__(self, step: int, marker: str, rank: int = 0, signum: str = "SIGKILL") -> None:
        super().__init__(step, marker, rank)
        self.signum = signal.Signals[signum]

    def fault(self, trainer: L.Trainer) -> None:
        os.kill(os.getpid(), self.signum)


class SignalAtStep(KillAtStep):
    """Send `signum` to this process (SIGTERM, SIGUSR1: what a scheduler sends) and let it carry on."""


class CrashAtStep(FaultAtStep):
    """An exception in the middle of training: the process ends, with whatever was saved before."""

    def fault(self, trainer: L.Trainer) -> None:
        raise RuntimeError(f"injected crash at step {trainer.global_step}")


class StorageFaultAtStep(FaultAtStep):
    """The disk under the run fails at step `step`.

    how=fill: fill the file system holding `mount` (a small tmpfs) with a file until it is full (real ENOSPC).
    how=enospc / erofs: zoo's checkpoint writer (torch.save) raises that errno from now on (where no tmpfs can be
    mounted; and for EROFS always: a file system cannot be remounted read-only while the run has files open).
    """

    def __init__(self, step: int, marker: str, how: str, mount: str | None = None) -> None:
        super().__init__(step, marker)
        self.how, self.mount = how, mount

    def fault(self, trainer: L.Trainer) -> None:
        if self.how == "fill":
            with open(Path(self.mount) / "filler", "wb", buffering=0) as handle:  # unbuffered: nothing left to flush
                try:
                    while True:
                        handle.write(b"\0" * 4096)
                except OSError as error:
                    assert error.errno == errno.ENOSPC, error
        else:
            code = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}[self.how]

            def refuse(*args, **kwargs):
                raise OSError(code, os.strerror(code))

            zoo.training.checkpoints.torch.save = refuse


class FaultySamples(torch.utils.data.Dataset):
    """`dataset` whose sample `index` raises (how=raise) or kills the DataLoader worker loading it (how=kill)."""

    def __init__(self, dataset, index: int, how: str) -> None:
        self.dataset, self.index, self.how = dataset, index, how

    def __len__(self) -> int:
        return len(self.dataset)

    def sample_source(self, index: int) -> str:
        return f"digits.npz#{index}"

    def __getitem__(self, index: int):
        if index == self.index:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(f"injected read error in sample {index}")
        return self.dataset[index]


class FaultyDigits(DigitsDataModule):
    """The digits, with one faulty training sample (see FaultySamples)."""

    def __init__(self, fault_index: int = 5, fault: str = "raise", **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault_index, self.fault = fault_index, fault

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if not isinstance(self.train_set, FaultySamples):
            self.train_set = FaultySamples(self.train_set, self.fault_index, self.fault)
