"""Lightning callbacks that let a run survive faults; the app layer adds them to every trainer (with
zoo.training.checkpoints.AtomicCheckpointIO, which writes checkpoints atomically).

- ResumeState: the random-number generators (python, numpy, torch, CUDA) travel in each checkpoint, so a
  resumed run draws the same data order, augmentations and dropout masks as an uninterrupted one.
- StopOnNonFiniteLoss: a NaN/Inf loss stops training before the update, naming the step.
- CheckpointOnInterrupt: SIGTERM (preemption, `kill`), SIGUSR1 (SLURM's time-limit warning; under SLURM the
  job is also requeued) or Ctrl-C saves `last.ckpt` at the next batch boundary, then exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichModelSummary, RichProgressBar
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_summary.model_summary import get_formatted_model_size, get_human_readable_count

from zoo.errors import NonFiniteLossError
from zoo.training.checkpoints import last_good_checkpoint_note
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
    captured after validation, and nothing draws from them before the next epoch's shuffle, so they are
    restored as the checkpoint is loaded. A checkpoint written in the middle of an epoch (every_n_train_steps,
    an interrupt; only shards resume there, zoo/data/shards.py) has them restored once more at train start: the
    resumed run's sanity check builds validation loaders after loading, and a DataLoader draws its workers' base
    seed from torch's generator (the shards' loaders draw theirs from a generator of their own).
    """

    def __init__(self) -> None:
        self.loaded: dict[str, Any] | None = None  # the checkpoint's states, until training starts

    def state_dict(self) -> dict[str, Any]:
        return {"rng": collect_rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            restore_rng_state(state_dict["rng"])
            self.loaded = state_dict["rng"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.loaded is not None and trainer.fit_loop.restarted_mid_epoch:
            restore_rng_state(self.loaded)
        self.loaded = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint.setdefault("zoo", identity(pl_module))  # zoo's tasks write it themselves; any other module too


# ---------------------------------------------------------------------------------------------------------
def checkpoint_folder(trainer: L.Trainer) -> Path | None:
    """Where the run's ModelCheckpoint writes (None without one)."""
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return Path(dirpath) if dirpath else None


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
            f"training stopped before that update, {last_good_checkpoint_note(checkpoint_folder(trainer))}; "
            "try a lower model.optimizer.lr, trainer.gradient_clip_val=1.0 or trainer.precision=32-true"
        )


class CheckpointOnInterrupt(Callback):
    """SIGTERM, the requeue signal or Ctrl-C during fit: finish the current batch, save `last.ckpt` next to
    ModelCheckpoint's files, print how to resume, exit. A second Ctrl-C quits at once without saving.

    SIGTERM is what a scheduler sends to preempt; the requeue signal (SIGUSR1, or the `requeue_signal` of
    Lightning's SLURMEnvironment plugin) is SLURM's warning before the time limit (`sbatch --signal=USR1@90`).
    Under SLURM with the plugin's `auto_requeue` (its default), the requeue signal also requeues the job
    (`scontrol requeue`, from rank 0 only); started again with `auto_resume=true` in the same run directory, it
    continues from that checkpoint. Lightning turns SIGTERM into SIGTERMException at a batch boundary (agreed
    by all ranks); the requeue signal goes the same way, and Ctrl-C too (a KeyboardInterrupt raised in the
    middle of an optimiser step would save half an update).
    """

    def __init__(self) -> None:
        self.interrupted = False
        self.saved_path: str | None = None
        self.signum: int | None = None  # the signal that stopped training (None: none, or Ctrl-C)
        self.requeued: str | None = None  # the SLURM job id requeued
        self._previous_handlers: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not on_fit_start: Lightning records the handlers after that hook and puts them back at teardown.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._install(signal.SIGINT, self._on_sigint)
        self._install(requeue_signal(trainer), lambda signum, frame: self._on_requeue_signal(trainer, signum))

    def _install(self, signum: int, handler: Any) -> None:
        with contextlib.suppress(ValueError):  # not the main thread: keep what is there
            self._previous_handlers[signum] = signal.signal(signum, handler)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        self._restore(signal.SIGINT)  # the next Ctrl-C raises KeyboardInterrupt immediately
        print("\nCtrl-C: saving a checkpoint after this batch (press Ctrl-C again to quit now)", file=sys.stderr)

    def _on_requeue_signal(self, trainer: L.Trainer, signum: int) -> None:
        # Lightning's own flag: it stops every rank at the same batch boundary, as for SIGTERM. (Lightning's
        # SLURM handler, replaced here, would save a checkpoint from inside the signal handler, mid-step.)
        self.signum = signum
        trainer._signal_connector.received_sigterm = True

    def _restore(self, *signums: int) -> None:
        for signum in signums or list(self._previous_handlers):
            if signum in self._previous_handlers:
                signal.signal(signum, self._previous_handlers.pop(signum))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.interrupted:
            raise KeyboardInterrupt

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()
        clean_stop = isinstance(exception, SIGTERMException) or (
            isinstance(exception, KeyboardInterrupt) and self.interrupted
        )
        if not clean_stop or trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        if isinstance(exception, SIGTERMException) and self.signum is None:
            self.signum = signal.SIGTERM
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
            print(f"interrupted ({type(exception).__name__}): no ModelCheckpoint, nothing saved", file=sys.stderr)
            return
        path = Path(checkpoint.dirpath) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        trainer.save_checkpoint(path, weights_only=False)  # the whole training state (weights_only=None logs a note)
        self.saved_path = str(path)
        reason = signal.Signals(self.signum).name if self.signum is not None else "Ctrl-C"
        note = f"resume with: python run.py ckpt_path={path}"
        if self.signum is not None and self.signum == requeue_signal(trainer):
            self.requeued = requeue_slurm_job(trainer)
            note = (
                f"requeued SLURM job {self.requeued}: started again with auto_resume=true in this run directory, "
                "it continues from there"
                if self.requeued
                else f"not requeued (not under SLURM with auto_requeue); {note}"
            )
        report_interrupt(reason, trainer.global_step, path, note)

    def exit_status(self) -> int:
        """128 + the signal that stopped training, as shells report a process ended by it (130 for Ctrl-C)."""
        return 128 + (self.signum or signal.SIGINT)


def slurm_environment(trainer: L.Trainer) -> Any:
    """Lightning's SLURMEnvironment plugin of this trainer, or None when not running under SLURM."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment  # what Lightning's signal connector reads
    return environment if isinstance(environment, SLURMEnvironment) else None


def requeue_signal(trainer: L.Trainer) -> int:
    environment = slurm_environment(trainer)
    return (environment.requeue_signal if environment is not None else None) or signal.SIGUSR1


def requeue_slurm_job(trainer: L.Trainer) -> str | None:
    """`scontrol requeue <job>` from rank 0 under SLURM with auto_requeue; the job id, or None if not requeued."""
    environment = slurm_environment(trainer)
    if environment is None or not environment.auto_requeue:
        return None
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    if not job or not trainer.is_global_zero:
        return None
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning(f"scontrol requeue {job} failed: {error}")
        return None
    if result.returncode != 0:
        log.warning(f"scontrol requeue {job} failed ({result.returncode}): {result.stderr.strip()}")
        return None
    return job


@rank_zero_only
def report_interrupt(reason: str, step: int, path: Path, note: str) -> None:
    print(f"interrupted by {reason} at step {step}: saved {path}; {note}", file=sys.stderr)


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary with what it can say truly: no FLOPs column (Lightning counts FLOPs only
    for a model with an example_input_array, and shows 0 otherwise), and the parameter size in MB read at 32 bits
    without a warning under mixed precision (the weights are fp32 there; autocast computes in bf16/fp16)."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Precision .* is not supported by the model summary")
            return super()._summary(trainer, pl_module)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(name, justify="right" if name in ("Params", "In sizes", "Out sizes") else "left")
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        frozen = total_parameters - trainable_parameters
        console.print(
            f"[bold]Trainable params[/]: {get_human_readable_count(int(trainable_parameters))}  "
            f"[bold]Non-trainable params[/]: {get_human_readable_count(int(frozen))}  "
            f"[bold]Size (MB)[/]: {get_formatted_model_size(model_size)}"
        )


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar, without a bogus total: a run bounded by steps (max_epochs=-1, as GPT's
    random blocks) reads "Steps of 600" rather than "Epoch 0/-2"."""

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Steps of {self.trainer.max_steps}" if self.trainer.max_steps > 0 else f"Epoch {current_epoch}"
        return f"{description:{len(self.validation_description)}}"
