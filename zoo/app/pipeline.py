"""The pieces `zoo.app.train.train` is built from: the trainer with zoo's safety net, the checks before fit, and
the faults during it.

Everything is built from the Hydra config with `hydra.utils.instantiate`, so the YAML files in conf/ are the
documentation of every knob. Every trainer also gets zoo's safety net (zoo/training/): atomic checkpoint
writes, generator states in checkpoints (exact resume), a stop on a non-finite loss, a checkpoint on
SIGTERM / SIGUSR1 / Ctrl-C (a SLURM requeue on SIGUSR1), and mixed precision that clips gradients with fused
optimisers. Checkpoints are read through zoo.weights (no code runs). Faults of the machine during fit or test (a
full or read-only disk, a rank or data-loader worker that died) end as one MachineFault naming the last good
checkpoint (`survivable_faults`); a stop by a signal ends the process with its status (`fitting`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ModelSummary
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import Precision
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

from zoo.app.cli import keep_run_folder
from zoo.app.devices import check_devices
from zoo.app.optuna_sweeper import trial_callbacks
from zoo.app.secrets import redact, redacted
from zoo.attention import kernel_notices
from zoo.data.samples import lost_worker
from zoo.errors import CheckpointError, MachineFault, UsageError, storage_failure
from zoo.tasks.base import ZooTask
from zoo.training.callbacks import CheckpointOnInterrupt, ResumeState, StopOnNonFiniteLoss, checkpoint_folder
from zoo.training.checkpoints import (
    AtomicCheckpointIO,
    check_task,
    last_good_checkpoint_note,
    newest_intact_checkpoint,
    storage_fault,
)
from zoo.training.distributed import lost_peer
from zoo.training.loggers import log_hydra_config
from zoo.training.precision import mixed_precision_plugin, resolve_precision
from zoo.weights import read_checkpoint

log = logging.getLogger("zoo")


@rank_zero_only
def print_config_tree(cfg: DictConfig, order: tuple[str, ...] = ("model", "attention", "data", "trainer")) -> None:
    """The resolved config as a rich tree, one branch per top-level group (secrets shown as ***)."""
    tree = Tree("config", guide_style="dim")
    keys = [k for k in order if k in cfg] + [k for k in cfg if k not in order]
    for key in keys:
        value = cfg[key]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        tree.add(f"[bold]{key}[/bold]").add(Syntax(redact(text), "yaml", background_color="default"))
    Console().print(tree)


def instantiate_list(section: DictConfig | None) -> list[Any]:
    """Instantiate every `_target_` entry of a callbacks/logger section (None/empty -> [])."""
    if not section:
        return []
    return [hydra.utils.instantiate(conf, _convert_="all") for conf in section.values() if conf and "_target_" in conf]


def with_safety_net(callbacks: list[Callback]) -> list[Callback]:
    """The configured callbacks plus zoo's reliability callbacks that are not there yet."""
    wanted = [StopOnNonFiniteLoss(), ResumeState(), CheckpointOnInterrupt()]
    return callbacks + [c for c in wanted if not any(isinstance(have, type(c)) for have in callbacks)]


def instantiate_task(cfg: DictConfig) -> ZooTask:
    """The model's Lightning task; what its attention would quietly do differently than asked is said now (e.g. a
    local window as long as the model's sequences)."""
    task = hydra.utils.instantiate(cfg.model, _convert_="all")
    for line in kernel_notices(task):
        log.warning(line)
    return task


def instantiate_callbacks(cfg: DictConfig) -> list[Callback]:
    """The configured callbacks, zoo's safety net, and the Optuna pruner of a sweep trial."""
    callbacks = with_safety_net(instantiate_list(cfg.get("callbacks"))) + trial_callbacks(cfg)
    if not cfg.trainer.get("enable_model_summary", True):  # the switch turns the configured summary off too
        callbacks = [c for c in callbacks if not isinstance(c, ModelSummary)]
    return callbacks


def instantiate_loggers(cfg: DictConfig) -> list[Logger]:
    loggers = instantiate_list(cfg.get("logger"))
    log_hydra_config(loggers, redacted(cfg))  # W&B: the resolved config of the run (secrets as ***)
    return loggers


def instantiate_trainer(cfg: DictConfig, callbacks: list[Callback], loggers: list[Logger]) -> L.Trainer:
    """cfg.trainer with atomic checkpoint writes and the precision `auto` resolves to on this hardware."""
    check_devices(cfg.trainer)
    plugins = hydra.utils.instantiate(cfg.trainer.get("plugins"), _convert_="all") or []
    plugins = plugins if isinstance(plugins, list) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    options: dict[str, Any] = {"enable_model_summary": False}  # the configured summary callback prints it, if any
    strategy = cfg.trainer.get("strategy")
    strategy = OmegaConf.to_container(strategy) if isinstance(strategy, DictConfig) else strategy
    accelerator = str(cfg.trainer.get("accelerator") or "auto")  # Lightning's default
    options["precision"] = resolve_precision(cfg.trainer.get("precision"), accelerator)  # `auto`: by the hardware
    precision = mixed_precision_plugin(options["precision"], accelerator, strategy)
    if precision is not None and not any(isinstance(p, Precision) for p in plugins):
        plugins.append(precision)  # clips gradients with fused optimisers too (zoo/training/precision.py)
        options["precision"] = None
    return hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=plugins, _convert_="all", **options
    )


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in sorted(metrics.items()) if torch.is_tensor(v) and v.numel() == 1 or isinstance(v, float)
    }


def checkpoint_dir(cfg: DictConfig) -> Path:
    dirpath = OmegaConf.select(cfg, "callbacks.last_checkpoint.dirpath", default=None) or OmegaConf.select(
        cfg, "callbacks.model_checkpoint.dirpath", default=None
    )
    return Path(dirpath) if dirpath else Path(cfg.paths.output_dir) / "checkpoints"


def prepare_checkpoint(cfg: DictConfig, task: ZooTask | None = None) -> str | None:
    """The checkpoint this run starts from, checked: `ckpt_path=last` and `auto_resume=true` pick this run
    directory's last.ckpt (auto_resume falls back to the newest intact checkpoint of the run when last.ckpt is
    truncated or corrupt, and says which it took); the file must load safely and belong to the configured model
    (and, given the built task, fit its weights). Returns its path, or None for a fresh start."""
    requested = cfg.get("ckpt_path")
    checkpoint = None
    if requested == "last" or (requested is None and cfg.get("auto_resume")):
        folder = checkpoint_dir(cfg)
        last = folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        if requested is None:  # auto_resume: whatever of this run can be continued
            requested, checkpoint = resumable_checkpoint(folder, last)
            if requested is None:
                log.info(f"auto_resume: no checkpoint in {folder} yet, starting fresh")
                return None
        elif last.is_file():
            requested = str(last)
        else:
            raise CheckpointError(
                f"ckpt_path=last but there is no {last}; continue a run with auto_resume=<its run directory> "
                "or ckpt_path=<its checkpoints/last.ckpt>"
            )
    if requested is None:
        return None
    checkpoint = checkpoint or read_checkpoint(requested)
    check_task(checkpoint, cfg.model._target_, str(requested), cfg.get("task_name"))
    if task is not None:
        task.check_checkpoint(checkpoint, str(requested))
    return str(requested)


def resumable_checkpoint(folder: Path, last: Path) -> tuple[str | None, dict | None]:
    """last.ckpt, or when it is unreadable (truncated, corrupt) the newest intact checkpoint in `folder`."""
    if not last.is_file() and not any(folder.glob("*.ckpt")):
        return None, None
    try:
        return str(last), read_checkpoint(last)
    except CheckpointError as error:
        found = newest_intact_checkpoint(folder, skip=last)
        if found is None:
            raise CheckpointError(
                f"auto_resume: {error}; no other checkpoint in {folder} reads whole either: start a new run "
                "(without auto_resume), or restore a copy of the run"
            ) from None
        path, checkpoint = found
        reason = "missing" if not last.is_file() else "unreadable"
        log.warning(
            f"auto_resume: {last.name} is {reason}; resuming from the newest intact checkpoint of the run, "
            f"{path} (step {checkpoint.get('global_step', '?')})"
        )
        return str(path), checkpoint


TEST_CHECKPOINTS = ("best", "last")


def test_checkpoint(cfg: DictConfig) -> str:
    choice = cfg.get("test_ckpt", "best")
    if choice not in TEST_CHECKPOINTS:
        raise UsageError(f"unknown test_ckpt {choice!r}; valid choices: {list(TEST_CHECKPOINTS)}")
    return choice


def tested_checkpoint(cfg: DictConfig, trainer: L.Trainer) -> str | None:
    """What test_ckpt= names after training: the best checkpoint, or None for the weights training ended with
    (test_ckpt=last, or no best checkpoint was saved: said in the log)."""
    checkpoint = trainer.checkpoint_callback
    if test_checkpoint(cfg) != "best" or checkpoint is None:
        return None
    if not checkpoint.best_model_path and cfg.get("test", True):
        log.warning(no_best_checkpoint_note(cfg))
    return checkpoint.best_model_path or None


def complete_run_metrics(
    cfg: DictConfig, trainer: L.Trainer, task: L.LightningModule, datamodule: L.LightningDataModule
) -> dict[str, float]:
    """The metrics of a run resumed from a checkpoint whose training was already complete (a sweep trial killed
    between its last checkpoint and its result): its weights are validated again, since a sweep's objective is a
    val metric, and the train metrics its earlier metrics.json holds are kept, so a resume loses nothing written."""
    log.info("resuming: the checkpoint's training is complete, nothing left to train; validating its weights")
    earlier: dict[str, float] = {}
    output_dir = cfg.get("paths", {}).get("output_dir")
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):  # none, unreadable or not metrics
        earlier = {k: float(v) for k, v in json.loads((Path(output_dir) / "metrics.json").read_text()).items()}
    with survivable_faults(trainer):
        trainer.validate(task, datamodule=datamodule, verbose=False)
    return {**earlier, **scalar_metrics(trainer.callback_metrics)}


def no_best_checkpoint_note(cfg: DictConfig) -> str:
    """Why test_ckpt=best found no best checkpoint, in the words of this run."""
    if cfg.trainer.get("fast_dev_run"):  # debug=fdr: one batch of each loop, Lightning saves no checkpoint
        return "trainer.fast_dev_run saves no checkpoint: the test reads the weights of its one training batch"
    return (
        "test_ckpt=best: no best checkpoint was saved (no validation ran during training, e.g. "
        "trainer.max_steps below trainer.val_check_interval); testing the final weights instead"
    )


def interrupt_status(trainer: L.Trainer) -> int:
    stopper = next((c for c in trainer.callbacks if isinstance(c, CheckpointOnInterrupt)), None)
    return stopper.exit_status() if stopper is not None else 143


@contextmanager
def fitting(trainer: L.Trainer, cfg: DictConfig) -> Iterator[None]:
    """Around trainer.fit: a stop by a signal ends the process with that signal's status (after the checkpoint
    CheckpointOnInterrupt saved), a run that took a step keeps its folder, a fault of the machine is one line."""
    try:
        with kept_once_trained(trainer, cfg), survivable_faults(trainer):
            yield
    except SIGTERMException:
        sys.exit(interrupt_status(trainer))  # 128 + the signal, as if it had ended the process (after saving)
    except SystemExit:
        if not trainer.interrupted:
            raise
        sys.exit(130)  # Lightning exits 1 on Ctrl-C; 130 = 128 + SIGINT, as shells report it


@contextmanager
def kept_once_trained(trainer: L.Trainer, cfg: DictConfig) -> Iterator[None]:
    """A run that took a training step keeps its folder whatever stops it (a non-finite loss at step 3 keeps
    its logs); one refused before its first step leaves nothing (zoo.app.cli.RunFolders.discard_refused)."""
    try:
        yield
    except BaseException:
        if trainer.global_step > 0 and cfg.get("paths", {}).get("output_dir"):
            keep_run_folder(cfg.paths.output_dir)
        raise


@contextmanager
def survivable_faults(trainer: L.Trainer) -> Iterator[None]:
    """Faults of the machine during fit or test as one MachineFault line: another rank that died or timed out,
    a data-loader worker that was killed, a disk that refused a write (each naming the last good checkpoint)."""
    try:
        yield
    except MachineFault:
        raise
    except Exception as error:
        folder = checkpoint_folder(trainer)
        failure = storage_failure(error)
        if failure is not None:
            raise storage_fault(failure, failure.filename or folder or ".", folder) from error
        peer = lost_peer(error, trainer.world_size, trainer.global_rank)
        what = peer or lost_worker(error)
        if what is None:
            raise
        if peer is not None and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signal.SIGKILL)  # ranks this process started: a hung one would stay
        raise MachineFault(f"{what}; {last_good_checkpoint_note(folder)}") from error
