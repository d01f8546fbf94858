"""What `python run.py` does: compose -> instantiate -> fit -> test the best checkpoint -> report.

Everything is built from the Hydra config with `hydra.utils.instantiate`, so the YAML files in conf/
are the documentation of every knob. Every trainer also gets zoo's safety net (zoo/callbacks.py): atomic
checkpoint writes, generator states in checkpoints (exact resume), a stop on a non-finite loss, and a
checkpoint on SIGTERM / Ctrl-C. Checkpoints are read through zoo/checkpoints.py (no code runs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins import Precision
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

from zoo.callbacks import AtomicCheckpointIO, CheckpointOnInterrupt, ResumeState, StopOnNonFiniteLoss
from zoo.checkpoints import CheckpointError, check_task, check_weights, load_checkpoint
from zoo.cli import EXIT_BAD_INPUT, UsageError, full_error_requested, user_error_message
from zoo.logging_utils import log_hydra_config
from zoo.precision import mixed_precision_plugin
from zoo.sweep import trial_failed, trial_objective

log = logging.getLogger("zoo")

# Lightning 2.6 on torch 2.14 warns about its own pytree use on every run; it is not the user's to fix.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)

# Environment variables whose values never reach a printed or saved config (W&B, Hugging Face, cloud keys).
SECRET_NAME = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def secret_values() -> list[str]:
    return sorted({v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 8}, key=len, reverse=True)


def redact(text: str) -> str:
    for secret in secret_values():
        text = text.replace(secret, "***")
    return text


def redacted(cfg: DictConfig) -> DictConfig:
    """A resolved copy of `cfg` with every secret value replaced by *** (for loggers that store the config)."""

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return redact(value) if isinstance(value, str) else value

    return OmegaConf.create(scrub(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)))


@rank_zero_only
def scrub_saved_config(output_dir: str | None) -> None:
    """Hydra saves the command line and config (.hydra/) before zoo runs; take secrets back out of them."""
    from hydra.core.hydra_config import HydraConfig

    if not output_dir or not HydraConfig.initialized() or HydraConfig.get().output_subdir is None:
        return
    for file in (Path(output_dir) / HydraConfig.get().output_subdir).glob("*.yaml"):
        text = file.read_text()
        if redact(text) != text:
            file.write_text(redact(text))


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


def with_safety_net(callbacks: list[Callback], model: str | None = None) -> list[Callback]:
    """The configured callbacks plus zoo's reliability callbacks that are not there yet."""
    wanted = [StopOnNonFiniteLoss(), ResumeState(model), CheckpointOnInterrupt()]
    return callbacks + [c for c in wanted if not any(isinstance(have, type(c)) for have in callbacks)]


def available_devices(accelerator: str) -> tuple[str, int]:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "GPU", torch.cuda.device_count()
    if accelerator == "mps":
        return "MPS device", int(torch.backends.mps.is_available())
    if accelerator in ("cpu", "auto"):
        return "CPU core", os.cpu_count() or 1
    return accelerator, -1  # others (tpu, custom): Lightning checks


def check_devices(trainer: DictConfig) -> None:
    """trainer.devices must fit the machine: ValueError naming what is there (Lightning itself would start
    more CPU processes than cores, or fail later with a long message for a missing GPU)."""
    devices = trainer.get("devices", "auto")
    kind, available = available_devices(str(trainer.get("accelerator", "auto")))
    if devices in ("auto", -1, "-1", None) or available < 0:
        return
    if isinstance(devices, str) and re.fullmatch(r"\d+", devices.strip()):
        devices = int(devices)
    if isinstance(devices, int):
        count, highest = devices, devices - 1
    else:
        indices = [int(i) for i in str(devices).replace("[", "").replace("]", "").split(",") if i.strip()]
        count, highest = len(indices), max(indices, default=0)
    if available == 0:
        accelerator = trainer.get("accelerator")
        raise ValueError(f"trainer.accelerator={accelerator} but this machine has no {kind}; valid: cpu or auto")
    if count <= 0 or highest >= available:
        raise ValueError(
            f"trainer.devices={devices} but this machine has {available} {kind}(s); valid: 1..{available}, -1 or auto"
        )


def build(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    task = hydra.utils.instantiate(cfg.model, _convert_="all")
    callbacks = with_safety_net(instantiate_list(cfg.get("callbacks")), model=cfg.get("task_name"))
    loggers = instantiate_list(cfg.get("logger"))
    log_hydra_config(loggers, redacted(cfg))  # W&B: the resolved config of the run (secrets as ***)
    check_devices(cfg.trainer)
    plugins = hydra.utils.instantiate(cfg.trainer.get("plugins"), _convert_="all") or []
    plugins = plugins if isinstance(plugins, list) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    options = {}
    strategy = cfg.trainer.get("strategy")
    strategy = OmegaConf.to_container(strategy) if isinstance(strategy, DictConfig) else strategy
    precision = mixed_precision_plugin(cfg.trainer.get("precision"), str(cfg.trainer.get("accelerator")), strategy)
    if precision is not None and not any(isinstance(p, Precision) for p in plugins):
        plugins.append(precision)  # clips gradients with fused optimisers too (zoo/precision.py)
        options["precision"] = None
    trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=plugins, _convert_="all", **options
    )
    return datamodule, task, trainer


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in sorted(metrics.items()) if torch.is_tensor(v) and v.numel() == 1 or isinstance(v, float)
    }


def checkpoint_dir(cfg: DictConfig) -> Path:
    dirpath = OmegaConf.select(cfg, "callbacks.last_checkpoint.dirpath", default=None) or OmegaConf.select(
        cfg, "callbacks.model_checkpoint.dirpath", default=None
    )
    return Path(dirpath) if dirpath else Path(cfg.paths.output_dir) / "checkpoints"


def prepare_checkpoint(cfg: DictConfig, task: torch.nn.Module | None = None) -> str | None:
    """The checkpoint this run starts from, checked: `ckpt_path=last` and `auto_resume=true` pick this run
    directory's last.ckpt; the file must load safely and belong to the configured model (and, given the
    built task, fit its weights). Returns its path, or None for a fresh start."""
    requested = cfg.get("ckpt_path")
    if requested == "last" or (requested is None and cfg.get("auto_resume")):
        last = checkpoint_dir(cfg) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        if last.is_file():
            requested = str(last)
        elif requested == "last":
            raise CheckpointError(
                f"ckpt_path=last but there is no {last}; continue a run with auto_resume=<its run directory> "
                "or ckpt_path=<its checkpoints/last.ckpt>"
            )
        else:
            log.info(f"auto_resume: no checkpoint in {last.parent} yet, starting fresh")
            return None
    if requested is None:
        return None
    checkpoint = load_checkpoint(requested)
    check_task(checkpoint, cfg.model._target_, str(requested), cfg.get("task_name"))
    if task is not None:
        check_weights(checkpoint, task, str(requested))
    return str(requested)


TEST_CHECKPOINTS = ("best", "last")


def test_checkpoint(cfg: DictConfig) -> str:
    choice = cfg.get("test_ckpt", "best")
    if choice not in TEST_CHECKPOINTS:
        raise UsageError(f"unknown test_ckpt {choice!r}; valid choices: {list(TEST_CHECKPOINTS)}")
    return choice


def train_and_test(cfg: DictConfig) -> dict[str, float]:
    """Fit (if cfg.train), then test the best (or last) checkpoint (if cfg.test); returns all scalar metrics."""
    test_checkpoint(cfg)  # a bad choice fails before training, not after
    datamodule, task, trainer = build(cfg)
    metrics: dict[str, float] = {}
    ckpt_path = prepare_checkpoint(cfg, task)
    if cfg.get("train", True):
        if ckpt_path:
            log.info(f"resuming from {ckpt_path}")
        try:
            trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SIGTERMException:
            sys.exit(143)  # 128 + SIGTERM, as if the signal had ended the process (a checkpoint was saved)
        except SystemExit:
            if not trainer.interrupted:
                raise
            sys.exit(130)  # Lightning exits 1 on Ctrl-C; 130 = 128 + SIGINT, as shells report it
        metrics.update(scalar_metrics(trainer.callback_metrics))
        ckpt_path = None  # test_ckpt=last: the weights training ended with
        checkpoint = trainer.checkpoint_callback
        if test_checkpoint(cfg) == "best" and checkpoint is not None and checkpoint.best_model_path:
            ckpt_path = checkpoint.best_model_path
    if cfg.get("test", True):
        if not cfg.get("train", True) and ckpt_path is None:
            raise ValueError("train=false needs ckpt_path=<checkpoint to evaluate>")
        trainer.test(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        metrics.update(scalar_metrics(trainer.callback_metrics))
    return metrics


# mode name -> function(cfg) -> metrics. Models add their own (generate, translate, ...).
MODES: dict[str, Callable[[DictConfig], dict[str, float]]] = {"train": train_and_test}


def register_mode(name: str) -> Callable:
    def wrap(fn: Callable) -> Callable:
        MODES[name] = fn
        return fn

    return wrap


def run(cfg: DictConfig) -> dict[str, float]:
    """Seed, print the config, run the chosen mode, report and save the metrics."""
    import zoo.modes  # noqa: F401  (registers the model-specific modes)

    scrub_saved_config(cfg.get("paths", {}).get("output_dir"))
    mode = cfg.get("mode", "train")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid choices: {sorted(MODES)}")
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("print_config", True):
        print_config_tree(cfg)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "high"))
    if mode != "train" and cfg.get("ckpt_path"):
        with open_dict(cfg):
            cfg.ckpt_path = prepare_checkpoint(cfg)
    metrics = MODES[mode](cfg)
    report(cfg, metrics)
    return metrics


@rank_zero_only
def report(cfg: DictConfig, metrics: dict[str, float]) -> None:
    if not metrics:
        return
    width = max(len(k) for k in metrics)
    print("\nfinal metrics:")
    for key, value in metrics.items():
        print(f"  {key:<{width}}  {value:.4f}")
    output_dir = cfg.get("paths", {}).get("output_dir")
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        target = Path(output_dir) / "metrics.json"
        temporary = target.with_name(f".metrics.json.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(metrics, indent=2) + "\n")
        os.replace(temporary, target)


def task_overrides() -> list[str]:
    """This run's command-line overrides (empty outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main(cfg: DictConfig) -> float | None:
    """run() with bad input reported as one line (exit status 2; HYDRA_FULL_ERROR=1 keeps the traceback);
    returns cfg.optimized_metric for sweepers."""
    try:
        metrics = run(cfg)
    except Exception as error:
        if in_sweep():
            return trial_failed(error)  # traceback logged, recorded in the job directory; the sweep goes on
        message = user_error_message(error, task_overrides())
        if message is None or full_error_requested():
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if in_sweep():
        return trial_objective(cfg, metrics)  # a missing or non-finite metric is a failed trial, not a crash
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None
