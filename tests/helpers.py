"""Test helpers: compose zoo's Hydra config in-process, or run `python run.py` for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def compose_config(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """The config `python run.py <overrides>` would see, with run outputs in output_dir."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.root_dir = str(ROOT)
            cfg.paths.output_dir = str(output_dir)
            cfg.paths.log_dir = str(output_dir)
            cfg.paths.data_dir = str(output_dir / "data")
    return cfg


def run_cli(
    args: list[str], cwd: Path = ROOT, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python run.py <args>` in a subprocess; returns the completed process (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
