"""One job of `zoo.app.run`: what Hydra calls with the composed config (lightning-hydra-template's `task_wrapper`,
as a function). It seeds, prints the config when asked, runs the mode `cfg.mode` names (zoo.app.modes.MODES;
train: zoo.app.train.train), reports and saves its metrics, and ends with the next command to try. Bad input ends
as one line (exit status 2), a fault of the machine too (status 3, with how to resume); in a sweep, a failed trial
is recorded and the sweep goes on (zoo.app.sweep)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict

from zoo.app.cli import RunFolders
from zoo.app.hints import HINT_ROOM, next_command, placement_hint
from zoo.app.modes import MODES
from zoo.app.pipeline import checkpoint_dir, prepare_checkpoint, print_config_tree
from zoo.app.reporting import EXIT_FAULT, exit_status, full_error_requested, unwrap, user_error_message
from zoo.app.secrets import scrub_saved_config
from zoo.app.sweep import trial_failed, trial_objective
from zoo.errors import MachineFault, check_choice
from zoo.training.banners import silence_banners
from zoo.training.checkpoints import last_good_checkpoint_note


def run_job(cfg: DictConfig, folders: RunFolders) -> tuple[dict[str, float], float | None]:
    """Run the mode of `cfg` as the command line does: (its metrics, the metric named by cfg.optimized_metric,
    which sweepers optimise). `folders`: what this run created, taken away again if it is refused."""
    name = cfg.get("mode", "train")
    training = name == "train"
    metrics: dict[str, float] = {}
    try:
        check_choice("mode", name, MODES)
        prepare(cfg, training)
        metrics = MODES[name](cfg)
        conclude(cfg, metrics, training)
    except Exception as error:
        if in_sweep():
            return metrics, trial_failed(error)  # traceback in the job's run.log and failure.txt; the sweep goes on
        exit_with_one_line(cfg, error, folders)
    if in_sweep():
        return metrics, trial_objective(cfg, metrics)  # a missing or non-finite metric is a failed trial, not a crash
    objective = cfg.get("optimized_metric")
    return metrics, metrics.get(objective) if objective else None


def prepare(cfg: DictConfig, training: bool) -> None:
    """Before any mode: secrets out of the saved config, seeds, matmul precision; the checkpoint of a mode other
    than training checked; the config printed when asked (training prints it once the run is built)."""
    silence_banners()  # Lightning's tips and "TPU available: False" lines; its console handler exists once imported
    scrub_saved_config(cfg.get("paths", {}).get("output_dir"))
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "high"))
    if not training and cfg.get("ckpt_path") and not Path(str(cfg.ckpt_path)).expanduser().is_dir():
        with open_dict(cfg):  # a checkpoint file; a folder written by mode=export is checked by zoo.load
            cfg.ckpt_path = prepare_checkpoint(cfg)
    if cfg.get("print_config") and not training:
        print_config_tree(cfg)


def conclude(cfg: DictConfig, metrics: dict[str, float], training: bool) -> None:
    """After any mode: the metrics reported and saved; a training run ends with the command that uses it."""
    report(cfg, metrics)
    if training and not in_sweep():
        next_command(cfg)


def exit_with_one_line(cfg: DictConfig, error: Exception, folders: RunFolders) -> None:
    """Bad input or a fault of the machine: `error: <one line>` on stderr and its exit status; a refused run
    leaves nothing behind. A bug (or HYDRA_FULL_ERROR=1) keeps its traceback."""
    message = user_error_message(error, task_overrides())
    if message is None or full_error_requested():
        raise error
    target = cfg.get("model", {}).get("_target_")
    message += placement_hint(unwrap(error), target, model_choice(), HINT_ROOM - len(f"error: {message}"))
    output_dir = cfg.get("paths", {}).get("output_dir")
    status = exit_status(error)
    if status == EXIT_FAULT and output_dir and cfg.get("mode", "train") == "train" and cfg.get("train", True):
        if not isinstance(unwrap(error), MachineFault):  # a write outside the checkpoint writer (metrics.json)
            message += f"; {last_good_checkpoint_note(checkpoint_dir(cfg))}"
        message += f"; once fixed, resume with: python run.py auto_resume={output_dir}"
    folders.discard_refused(output_dir, bad_input=status != EXIT_FAULT)  # refused before its first step: no folder
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


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


def model_choice() -> str | None:
    """The model= option of this run (llama, say, where the task names its family: gpt); None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None


def in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
