"""Sweeps: a grid and an Optuna search finish with failing trials recorded, one directory per job, a summary
table and optimization_results.yaml; launcher configs compose; DDP jobs inside a sweep restart only themselves."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf, read_write

from tests.helpers import CONF, compose_config, run_cli
from zoo.app.sweep import FAILURE_FILE, SweepJobs, best_job, trial_objective, varying_overrides

# A ViT that trains one short epoch (so val/acc exists) in about a second.
TINY_VIT = [
    "model.net.mlp_dim=32", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "callbacks=none", "logger=none",
    "data.augment=false", "print_config=false",
]  # fmt: skip


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with (sweep_dir / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_varying_overrides_drop_the_shared_ones_and_best_job_follows_the_mode() -> None:
    records = [
        {"job": 0, "overrides": ["model=vit", "attention=full"], "status": "completed", "value": 0.5},
        {"job": 1, "overrides": ["model=vit", "attention=local"], "status": "completed", "value": 0.7},
        {"job": 2, "overrides": ["model=vit", "attention=linear"], "status": "failed", "value": None},
    ]
    assert varying_overrides(records) == [["attention=full"], ["attention=local"], ["attention=linear"]]
    assert best_job(records, "max") == 1
    assert best_job(records, "min") == 0
    assert best_job(records[2:], "max") is None


def test_trial_objective_turns_missing_or_non_finite_metrics_into_failed_trials(tmp_path: Path) -> None:
    cfg = compose_config(["model=vit"], tmp_path)
    with read_write(cfg.hydra):
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    assert trial_objective(cfg, {"val/acc": 0.9}) == 0.9
    assert not (tmp_path / FAILURE_FILE).exists()
    assert trial_objective(cfg, {"val/acc": float("nan")}) is None
    assert "is nan" in (tmp_path / FAILURE_FILE).read_text()
    assert trial_objective(cfg, {"train/loss": 1.0}) is None
    assert "'val/acc' was not logged" in (tmp_path / FAILURE_FILE).read_text()


def test_sweep_job_rewrites_the_command_line_for_ddp_ranks_and_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = compose_config(["model=vit", "attention=local"], tmp_path)
    with read_write(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.runtime.output_dir = str(tmp_path / "3")
    HydraConfig.instance().set_config(cfg)
    argv = ["run.py", "-m", "-cn", "config", "model=vit", "attention=full,local", "hparams_search=vit_optuna"]
    monkeypatch.setattr(sys, "argv", list(argv))
    monkeypatch.setenv("MASTER_PORT", "1234")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    jobs = SweepJobs()
    jobs.on_job_start(config=cfg)
    # What Lightning's launcher reads: this job's overrides in run mode, and the job directory.
    assert sys.argv == ["run.py", "-cn", "config", "model=vit", "attention=local", "hydra.mode=RUN"]
    assert HydraConfig.get().run.dir == str(tmp_path / "3")
    os.environ["LOCAL_RANK"] = "0"  # as Lightning's launcher leaves it
    os.environ["MASTER_PORT"] = "5678"
    jobs.on_job_end(config=cfg, job_return=None)
    assert sys.argv == argv
    assert "LOCAL_RANK" not in os.environ and os.environ["MASTER_PORT"] == "1234"


def test_launcher_configs_take_their_resources_from_the_trainer(tmp_path: Path) -> None:
    cfg = compose_config(["hydra/launcher=submitit_slurm", "trainer=multinode", "trainer.devices=8"], tmp_path)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    assert launcher._target_.endswith("SlurmLauncher")
    # Resolved key by key: submitit_folder interpolates the sweep directory, which only a sweep has.
    settings = {key: launcher[key] for key in launcher if key != "submitit_folder"}
    slurm = instantiate({**settings, "submitit_folder": str(tmp_path / ".submitit")})
    assert type(slurm).__name__ == "SlurmLauncher"
    cfg = compose_config(["hydra/launcher=joblib"], tmp_path)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert (cfg.hydra.launcher.n_jobs, cfg.hydra.launcher.prefer) == (2, "processes")


@pytest.mark.parametrize("launcher", ["submitit_slurm", "joblib"])
def test_launcher_configs_named_like_the_plugins_compose_without_warnings(launcher: str) -> None:
    # zoo's file shadows the plugin's structured config of that name; Hydra's notice about it is silenced.
    result = run_cli([f"hydra/launcher={launcher}", "--cfg", "hydra", "-p", "hydra.launcher"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == "" and "_target_: hydra_plugins." in result.stdout


@pytest.mark.parametrize(
    "model", sorted(p.stem.removesuffix("_optuna") for p in (CONF / "hparams_search").glob("*.yaml"))
)
def test_every_optuna_search_matches_its_model(model: str, tmp_path: Path) -> None:
    cfg = compose_config([f"hparams_search={model}_optuna"], tmp_path)
    assert cfg.hydra.mode == RunMode.MULTIRUN
    assert cfg.model._target_ == compose_config([f"model={model}"], tmp_path).model._target_
    sweeper = cfg.hydra.sweeper
    assert sweeper.direction == {"max": "maximize", "min": "minimize"}[cfg.model_metric.mode]
    assert sweeper.max_failure_rate == 1.0
    assert "attention" in sweeper.params and "model.optimizer.lr" in sweeper.params
    for key in sweeper.params:  # every searched key exists in the model's config
        assert key == "attention" or OmegaConf.select(cfg, key) is not None, key


@pytest.mark.slow
def test_grid_sweep_in_parallel_records_a_failing_job_and_prints_the_summary(tmp_outputs: Path) -> None:
    # num_heads=3 does not divide dim=16: that job fails, the other one finishes, the sweep exits 0.
    result = run_cli(
        ["-m", "model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2,3",
         "hydra/launcher=joblib", f"paths.log_dir={tmp_outputs}", *TINY_VIT]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_outputs / "vit" / "multirun").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
    rows = read_summary(sweep_dir)
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "failed")]
    assert 0.0 <= float(rows[0]["value"]) <= 1.0 and rows[0]["metric"] == "val/acc"
    assert "divisible by num_heads" in rows[1]["error"]
    assert "sweep: 2 jobs, 1 failed" in result.stdout
    assert "model.net.num_heads=3" in result.stdout


@pytest.mark.slow
def test_optuna_search_of_three_trials_goes_on_after_a_failure_and_writes_results(tmp_outputs: Path) -> None:
    # dim 18 does not split into 4 heads: with the sampler's seed the second trial draws it and fails.
    result = run_cli(
        ["hparams_search=vit_optuna", "hydra.sweeper.n_trials=3",
         "hydra.sweeper.params={model.net.dim:'choice(16, 18)',model.net.depth:'choice(1)'}",
         f"paths.log_dir={tmp_outputs}", *TINY_VIT]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_outputs / "vit" / "multirun").iterdir()
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.name == "optuna"
    assert set(results.best_params) == {"model.optimizer.lr", "data.batch_size", "model.net.depth", "model.net.dim",
                                        "attention"}  # fmt: skip
    assert results.best_params["model.net.dim"] == 16
    rows = read_summary(sweep_dir)
    assert len(rows) == 3
    assert sorted(row["status"] for row in rows) == ["completed", "completed", "failed"]
    completed = [float(row["value"]) for row in rows if row["status"] == "completed"]
    assert results.best_value == max(completed)
