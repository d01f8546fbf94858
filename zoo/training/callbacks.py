"""Lightning callbacks that let a run survive faults; the app layer adds them to every trainer (with
zoo.training.checkpoints.AtomicCheckpointIO, which writes checkpoints atomically).

- ResumeState: the random-number generators (python, numpy, torch, CUDA) travel in each checkpoint, so a
  resumed run draws the same data order, augmentations and dropout masks as an uninterrupted one.
- StopOnNonFiniteLoss: a NaN/Inf loss stops training before the update, naming the step.
- CheckpointOnInterrupt: SIGTERM (preemption, `kill`) or Ctrl-C saves `last.ckpt` at the next batch
  boundary, then exits.
"""

from __future__ import annotations

import logging
import random
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo.errors import NonFiniteLossError
from zoo.weights import identity

log = logging.getLogger("zoo")


# ---------------------------------------------------------------------------------------------------------
def collect_rng_state() -> dict[str, Any]:
    """Every global generator's state, as tensors and plain values (loadable with weights_only=True)."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ResumeState(Callback):
    """Random-generator states in every checkpoint, restored on resume (Lightning restores the model,
    optimiser, schedule and loop counters, but not the generators); and the checkpoint's identity marker
    (zoo.weights.identity) for modules that are not zoo tasks.

    Checkpoints written at epoch ends (ModelCheckpoint's) resume bit for bit: the generators are
    captured after validation, and nothing draws from them before the next epoch's shuffle.
    """

    def state_dict(self) -> dict[str, Any]:
        return {"rng": collect_rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            restore_rng_state(state_dict["rng"])

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint.setdefault("zoo", identity(pl_module))  # zoo's tasks write it themselves; any other module too


# ---------------------------------------------------------------------------------------------------------
def last_checkpoint_note(trainer: L.Trainer) -> str:
    saved = [getattr(c, "last_model_path", "") or c.best_model_path for c in trainer.checkpoint_callbacks]
    saved = [p for p in saved if p and Path(p).is_file()]
    if saved:
        return f"the last good checkpoint is kept: {max(saved, key=lambda p: Path(p).stat().st_mtime)}"
    return "no checkpoint had been written yet"


class StopOnNonFiniteLoss(Callback):
    """Raise NonFiniteLossError before backward when the loss is NaN or infinite: the weights never see
    the bad update, and no checkpoint is written after it (the last good one stays)."""

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if bool(torch.isfinite(loss.detach()).all()):
            return
        value = loss.detach().float().flatten()[0].item()
        batch = trainer.fit_loop.epoch_loop.batch_idx + 1
        raise NonFiniteLossError(
            f"training loss is {value} at step {trainer.global_step} (epoch {trainer.current_epoch}, batch {batch}); "
            f"training stopped before that update, {last_checkpoint_note(trainer)}; "
            "try a lower model.optimizer.lr, trainer.gradient_clip_val=1.0 or trainer.precision=32-true"
        )


class CheckpointOnInterrupt(Callback):
    """SIGTERM or Ctrl-C during fit: finish the current batch, save `last.ckpt` next to ModelCheckpoint's
    files, print how to resume, exit. A second Ctrl-C quits at once without saving.

    Lightning already turns SIGTERM into SIGTERMException at a batch boundary; Ctrl-C is made to behave
    the same (a KeyboardInterrupt raised in the middle of an optimiser step would save half an update).
    """

    def __init__(self) -> None:
        self.interrupted = False
        self.saved_path: str | None = None
        self._previous_handler: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not on_fit_start: Lightning records the handlers after that hook and puts them back at teardown.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            try:
                self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
            except ValueError:  # not the main thread: keep Python's default
                self._previous_handler = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        self._restore_sigint()  # the next Ctrl-C raises KeyboardInterrupt immediately
        print("\nCtrl-C: saving a checkpoint after this batch (press Ctrl-C again to quit now)", file=sys.stderr)

    def _restore_sigint(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.interrupted:
            raise KeyboardInterrupt

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()
        clean_stop = isinstance(exception, SIGTERMException) or (
            isinstance(exception, KeyboardInterrupt) and self.interrupted
        )
        if not clean_stop or trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
            print(f"interrupted ({type(exception).__name__}): no ModelCheckpoint, nothing saved", file=sys.stderr)
            return
        path = Path(checkpoint.dirpath) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        trainer.save_checkpoint(path)
        self.saved_path = str(path)
        reason = "SIGTERM" if isinstance(exception, SIGTERMException) else "Ctrl-C"
        report_interrupt(reason, trainer.global_step, path)


@rank_zero_only
def report_interrupt(reason: str, step: int, path: Path) -> None:
    print(
        f"interrupted by {reason} at step {step}: saved {path}; resume with: python run.py ckpt_path={path}",
        file=sys.stderr,
    )
