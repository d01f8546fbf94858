"""The body of `python run.py`'s Hydra task: seed, print the config, run the chosen mode (zoo.app.modes),
report the metrics; in a sweep, a failed trial is recorded and the sweep goes on (zoo.app.sweep)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict

from zoo.app.cli import discard_unstarted_run
from zoo.app.modes import MODES, suggest_prediction
from zoo.app.pipeline import checkpoint_dir, prepare_checkpoint, print_config_tree
from zoo.app.reporting import EXIT_FAULT, exit_status, full_error_requested, unwrap, user_error_message
from zoo.app.secrets import scrub_saved_config
from zoo.app.sweep import trial_failed, trial_objective
from zoo.errors import MachineFault, check_choice
from zoo.training.checkpoints import last_good_checkpoint_note


def run(cfg: DictConfig) -> dict[str, float]:
    """Seed, check, print the config, run the chosen mode, report and save the metrics."""
    scrub_saved_config(cfg.get("paths", {}).get("output_dir"))
    mode = cfg.get("mode", "train")
    check_choice("mode", mode, MODES)
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "high"))
    if mode != "train" and cfg.get("ckpt_path") and not Path(str(cfg.ckpt_path)).expanduser().is_dir():
        with open_dict(cfg):  # a checkpoint file; a folder written by mode=export is checked by zoo.load
            cfg.ckpt_path = prepare_checkpoint(cfg)
    if cfg.get("print_config", True) and mode != "train":
        print_config_tree(cfg)  # the train mode prints it once the run is built and checked (zoo.app.pipeline)
    metrics = MODES[mode](cfg)
    report(cfg, metrics)
    if mode == "train" and not in_sweep():
        suggest_prediction(cfg)  # a ViT run ends with the command that predicts with its checkpoint
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
    """run() with bad input reported as one line (exit status 2), a fault of the machine too (status 3, with
    how to resume); HYDRA_FULL_ERROR=1 keeps the traceback. Returns cfg.optimized_metric for sweepers."""
    try:
        metrics = run(cfg)
    except Exception as error:
        if in_sweep():
            return trial_failed(error)  # traceback logged, recorded in the job directory; the sweep goes on
        message = user_error_message(error, task_overrides())
        if message is None or full_error_requested():
            raise
        output_dir = cfg.get("paths", {}).get("output_dir")
        status = exit_status(error)
        if status == EXIT_FAULT and output_dir and cfg.get("mode", "train") == "train" and cfg.get("train", True):
            if not isinstance(unwrap(error), MachineFault):  # a write outside the checkpoint writer (metrics.json)
                message += f"; {last_good_checkpoint_note(checkpoint_dir(cfg))}"
            message += f"; once fixed, resume with: python run.py auto_resume={output_dir}"
        discard_unstarted_run(output_dir)  # a run refused before it started leaves no folder behind
        print(f"error: {message}", file=sys.stderr)
        sys.exit(status)
    if in_sweep():
        return trial_objective(cfg, metrics)  # a missing or non-finite metric is a failed trial, not a crash
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None
