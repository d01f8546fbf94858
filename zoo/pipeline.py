"""What `python run.py` does: compose -> instantiate -> fit -> test the best checkpoint -> report.

Everything is built from the Hydra config with `hydra.utils.instantiate`, so the YAML files in conf/
are the documentation of every knob.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

log = logging.getLogger("zoo")

# Exceptions that mean "bad input": printed as one line (no traceback unless HYDRA_FULL_ERROR=1).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, KeyError)


@rank_zero_only
def print_config_tree(cfg: DictConfig, order: tuple[str, ...] = ("model", "attention", "data", "trainer")) -> None:
    """The resolved config as a rich tree, one branch per top-level group."""
    tree = Tree("config", guide_style="dim")
    keys = [k for k in order if k in cfg] + [k for k in cfg if k not in order]
    for key in keys:
        value = cfg[key]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        tree.add(f"[bold]{key}[/bold]").add(Syntax(text, "yaml", background_color="default"))
    Console().print(tree)


def instantiate_list(section: DictConfig | None) -> list[Any]:
    """Instantiate every `_target_` entry of a callbacks/logger section (None/empty -> [])."""
    if not section:
        return []
    return [hydra.utils.instantiate(conf, _convert_="all") for conf in section.values() if conf and "_target_" in conf]


def build(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    task = hydra.utils.instantiate(cfg.model, _convert_="all")
    callbacks = instantiate_list(cfg.get("callbacks"))
    loggers = instantiate_list(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all")
    return datamodule, task, trainer


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in sorted(metrics.items()) if torch.is_tensor(v) and v.numel() == 1 or isinstance(v, float)}


def train_and_test(cfg: DictConfig) -> dict[str, float]:
    """Fit (if cfg.train), then test the best checkpoint (if cfg.test); returns all scalar metrics."""
    datamodule, task, trainer = build(cfg)
    metrics: dict[str, float] = {}
    ckpt_path = cfg.get("ckpt_path")
    if cfg.get("train", True):
        trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path)
        metrics.update(scalar_metrics(trainer.callback_metrics))
        ckpt_path = None
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
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

    mode = cfg.get("mode", "train")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid choices: {sorted(MODES)}")
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("print_config", True):
        print_config_tree(cfg)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "high"))
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
        (Path(output_dir) / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main(cfg: DictConfig) -> float | None:
    """run() with bad input reported as one line; returns cfg.optimized_metric for sweepers."""
    try:
        metrics = run(cfg)
    except USER_ERRORS as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None
