"""Sweeps: a grid and an Optuna search finish with failing trials recorded, one directory per job, a summary
table, plots and optimization_results.yaml; Optuna trials are pruned (PRUNED, not FAIL), a killed search resumes
without running a finished trial again, DDP ranks of a trial share its parameters; a sweep whose jobs all fail
ends with one line; launcher configs compose; DDP jobs inside a sweep restart only themselves."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf, read_write

from tests.helpers import CONF, ROOT, compose_config, run_cli, run_in_process
from zoo.app.optuna_sweeper import make_pruner
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
    assert sweeper._target_ == "hydra_plugins.zoo_sweepers.OptunaSweeper"
    assert sweeper.direction == cfg.model_metric.mode and sweeper.study_name == model  # follow the model
    assert sweeper.max_failure_rate == 1.0
    for key in sweeper.params:  # every searched key exists in the model's config (a conditional one where it applies)
        when = [f"{other}={values[0]}" for other, values in sweeper.get("conditions", {}).get(key, {}).items()]
        where = compose_config([f"hparams_search={model}_optuna", *when], tmp_path) if when else cfg
        assert key == "attention" or OmegaConf.select(where, key) is not None, key


# The knobs every search space has, and the key each model names it by (GPT keeps nanoGPT's names).
KNOBS = {
    "lr": ["model.optimizer.lr"] * 4,
    "batch size": ["data.batch_size", "data.batch_size", "data.max_tokens", "data.batch_size"],
    "width": ["model.net.image.dim", "model.net.n_embd", "model.net.dim", "model.net.dim"],
    "depth": ["model.net.image.depth", "model.net.n_layer", "model.net.encoder_layers", "model.net.depth"],
    "attention variant": ["attention"] * 4,
    "attention window": ["attention.window"] * 4,
}


def test_every_search_space_has_the_same_knobs(tmp_path: Path) -> None:
    for i, model in enumerate(["clip", "gpt", "translation", "vit"]):
        params = compose_config([f"hparams_search={model}_optuna"], tmp_path).hydra.sweeper.params
        for knob, keys in KNOBS.items():
            assert keys[i] in params, f"{model}_optuna does not search the {knob} ({keys[i]})"
        assert params.attention == "choice(full, local, linear, rope)"


@pytest.mark.parametrize("pruner", ["median", "successive_halving", "hyperband", "none"])
def test_each_pruner_config_builds_its_optuna_pruner(pruner: str, tmp_path: Path) -> None:
    import optuna

    cfg = compose_config(["hparams_search=vit_optuna", f"hydra/sweeper/pruner={pruner}"], tmp_path)
    kinds = {"median": "MedianPruner", "successive_halving": "SuccessiveHalvingPruner",
             "hyperband": "HyperbandPruner", "none": "NopPruner"}  # fmt: skip
    built = make_pruner(cfg.hydra.sweeper.pruner)
    assert isinstance(built, getattr(optuna.pruners, kinds[pruner]))
    default = compose_config(["hparams_search=vit_optuna"], tmp_path).hydra.sweeper.pruner
    assert default._target_ == "optuna.pruners.MedianPruner"


def test_grid_sweep_in_parallel_records_a_failing_job_and_prints_the_summary(tmp_outputs: Path, capsys) -> None:
    # num_heads=3 does not divide dim=16: that job fails, the other one finishes, the sweep exits 1. The sweep runs
    # in this process (its jobs in joblib's worker processes, as from the command line).
    code, out, err = run_in_process(
        ["-m", "model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2,3",
         "hydra/launcher=joblib", f"paths.log_dir={tmp_outputs}", *TINY_VIT], capsys
    )  # fmt: skip
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 2 jobs of the sweep failed (the others finished: "), last
    assert "summary.csv); job 1: " in last and "divisible by num_heads" in last
    (sweep_dir,) = (tmp_outputs / "vit" / "multirun").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
    rows = read_summary(sweep_dir)
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "failed")]
    assert 0.0 <= float(rows[0]["value"]) <= 1.0 and rows[0]["metric"] == "val/acc"
    assert "divisible by num_heads" in rows[1]["error"]
    assert "sweep: 2 jobs, 1 failed" in out
    assert "model.net.num_heads=3" in out


def test_optuna_search_of_three_trials_goes_on_after_a_failure_and_writes_results(tmp_outputs: Path, capsys) -> None:
    # dim 18 does not split into 4 heads: with the sampler's seed the second trial draws it and fails.
    code, _, err = run_in_process(
        ["hparams_search=vit_optuna", "hydra.sweeper.n_trials=3",
         "hydra.sweeper.params={model.net.dim:'choice(16, 18)',model.net.depth:'choice(1)'}",
         f"paths.log_dir={tmp_outputs}", *TINY_VIT], capsys
    )  # fmt: skip
    assert code == 0, err[-3000:]
    (sweep_dir,) = (tmp_outputs / "vit" / "multirun").iterdir()
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.name == "optuna"
    assert set(results.best_params) - {"attention.window"} == {
        "model.optimizer.lr",
        "data.batch_size",
        "model.net.depth",
        "model.net.dim",
        "attention",
    }
    # the window is searched only in trials of local attention (hydra.sweeper.conditions)
    assert ("attention.window" in results.best_params) == (results.best_params["attention"] == "local")
    assert results.best_params["model.net.dim"] == 16
    rows = read_summary(sweep_dir)
    assert len(rows) == 3
    assert sorted(row["status"] for row in rows) == ["completed", "completed", "failed"]
    completed = [float(row["value"]) for row in rows if row["status"] == "completed"]
    assert results.best_value == max(completed)


# -- Optuna: pruning, resume, DDP inside a trial ------------------------------------------------------
# A GPT of 1 layer on the embedded corpus, validating every 2 of 6 steps: 3 reports to the pruner per trial.
TINY_GPT_TRIAL = [
    "hparams_search=gpt_optuna", "data.batch_size=8", "model.net.n_layer=1", "model.net.n_embd=16",
    "model.net.n_head=2", "attention=full", "data.block_size=16", "data.eval_batches=1",
    "model.scheduler.warmup_steps=0", "trainer.max_steps=6", "trainer.val_check_interval=2",
    "model.sample.max_new_tokens=0", "callbacks=none", "logger=none", "print_config=false", "test=false",
]  # fmt: skip
# Only the learning rate is searched, good or hopeless; this seed draws good, then hopeless three times.
GOOD_THEN_HOPELESS = [
    "hydra.sweeper.params={model.optimizer.lr:'choice(0.01, 0.0000001)'}",
    "hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler", "~hydra.sweeper.sampler.n_startup_trials",
    "hydra.sweeper.sampler.seed=11", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=1",
    "hydra.sweeper.pruner.n_warmup_steps=0",
]  # fmt: skip


def load_study(sweep_dir: Path, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_optuna_search_prunes_hopeless_trials_and_plots_the_study(tmp_outputs: Path, capsys) -> None:
    from optuna.trial import TrialState

    sweep_dir = tmp_outputs / "sweep"
    code, out, err = run_in_process(
        [*TINY_GPT_TRIAL, *GOOD_THEN_HOPELESS, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep_dir}",
         f"paths.log_dir={tmp_outputs}", f"paths.data_dir={tmp_outputs / 'data'}"],
        capsys,
    )  # fmt: skip
    assert code == 0, (out + err)[-3000:]
    trials = load_study(sweep_dir, "gpt").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] + [TrialState.PRUNED] * 3
    assert list(trials[0].intermediate_values) == [1, 2, 3]  # one report per validation
    assert all(list(t.intermediate_values) == [1] for t in trials[1:])  # stopped at the first: compute saved
    rows = read_summary(sweep_dir)
    assert [row["status"] for row in rows] == ["completed", "pruned", "pruned", "pruned"]
    assert float(rows[1]["value"]) == pytest.approx(trials[1].value)  # the last value reported
    assert "sweep: 4 jobs, 0 failed, 3 pruned" in out
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.best_params == {"model.optimizer.lr": 0.01} and results.trials.pruned == 3
    for plot in ("optimization_history", "parallel_coordinates"):  # importances need two completed trials
        assert is_png(sweep_dir / f"{plot}.png"), plot


def test_a_killed_optuna_search_resumes_and_runs_no_finished_trial_again(tmp_outputs: Path, capsys) -> None:
    from optuna.trial import TrialState

    sweep_dir = tmp_outputs / "sweep"
    args = ["hparams_search=vit_optuna", "hydra.sweeper.n_trials=4", "hydra/sweeper/pruner=none",
            "hydra.sweeper.params={model.optimizer.lr:'tag(log, interval(1e-3, 1e-2))'}", "data.batch_size=32",
            "model.net.dim=16", "model.net.depth=1", "attention=full", f"hydra.sweep.dir={sweep_dir}",
            f"paths.log_dir={tmp_outputs}", *TINY_VIT]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    log = (tmp_outputs / "first.log").open("w")
    first = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 300
    while not (sweep_dir / "2" / ".hydra").is_dir():  # trial 2 has started: 0 and 1 are finished
        assert first.poll() is None and time.monotonic() < deadline, (tmp_outputs / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    log.close()
    finished = {job: (sweep_dir / job / "job.json").stat().st_mtime_ns for job in ("0", "1")}
    trials = load_study(sweep_dir, "vit").trials
    states = [(t.state, t.user_attrs.get("error")) for t in trials]
    assert [t.state for t in trials][:3] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING], (
        states,
        (tmp_outputs / "first.log").read_text()[-3000:],
    )
    code, out, err = run_in_process(args, capsys)  # the resume: in this process (the kill needed one of its own)
    assert code == 0, err[-3000:]
    assert "1 interrupted trial(s) run again" in out + err
    trials = load_study(sweep_dir, "vit").trials
    errors = {t.number: t.user_attrs.get("error") for t in trials if t.state != TrialState.COMPLETE}
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4 and [t.number for t in trials] == [0, 1, 2, 3], errors
    launched = re.findall(r"\t#(\d+) : ", out + err)
    assert launched == ["2", "3"]  # the interrupted trial and a new one; 0 and 1 did not run again
    assert {job: (sweep_dir / job / "job.json").stat().st_mtime_ns for job in ("0", "1")} == finished
    assert [row["status"] for row in read_summary(sweep_dir)] == ["completed"] * 4  # the table of the whole study
    for plot in ("optimization_history", "parallel_coordinates", "param_importances"):
        assert is_png(sweep_dir / f"{plot}.png"), plot


def test_ddp_ranks_of_a_trial_train_with_rank_zeros_parameters_and_stop_together(tmp_outputs: Path) -> None:
    from optuna.trial import TrialState

    sweep_dir = tmp_outputs / "sweep"
    result = run_cli(
        [*TINY_GPT_TRIAL, *GOOD_THEN_HOPELESS, "hydra.sweeper.n_trials=2", "trainer=ddp_cpu",
         "+callbacks.replica_check._target_=zoo.training.distributed.ReplicaCheck", f"hydra.sweep.dir={sweep_dir}",
         f"paths.log_dir={tmp_outputs}", f"paths.data_dir={tmp_outputs / 'data'}"],
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trials = load_study(sweep_dir, "gpt").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]  # rank 1 started no search of its own
    for trial in trials:
        check = replica_check(sweep_dir / str(trial.number))
        # same weights on both ranks after training with the trial's learning rate: the same parameters
        assert check["world_size"] == 2 and check["replicas_identical"], check
        assert (sweep_dir / str(trial.number) / "train_ddp_process_1.log").is_file()
    assert len(replica_check(sweep_dir / "1")["losses"]) < len(replica_check(sweep_dir / "0")["losses"])  # stopped


def replica_check(job_dir: Path) -> dict:
    import json

    return json.loads((job_dir / "replica_check.json").read_text())


@pytest.mark.parametrize("sweep", ["optuna", "grid"])
def test_a_sweep_whose_jobs_all_fail_ends_with_the_first_cause_in_one_line(sweep: str, tmp_outputs: Path, capsys):
    # dim 18 does not split into 4 heads: every job fails
    jobs = {"optuna": ["hparams_search=vit_optuna", "hydra.sweeper.n_trials=2", "attention=full"],
            "grid": ["-m", "model=vit", "attention=full,local"]}[sweep]  # fmt: skip
    code, out, err = run_in_process(
        [*jobs, "model.net.dim=18", "model.net.depth=1", f"hydra.sweep.dir={tmp_outputs / 'sweep'}",
         f"paths.log_dir={tmp_outputs}", *TINY_VIT],
        capsys,
    )  # fmt: skip
    assert code == 2, (out + err)[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: all 2 jobs of the sweep failed; job 0: dim must be divisible by num_heads"), last
    # the console gets one line per failed job; its traceback is in the job's run.log
    assert "Traceback" not in out + err and (out + err).count("trial failed, the sweep goes on") == 2, out + err
    for job in ("0", "1"):
        assert "Traceback" in (tmp_outputs / "sweep" / job / "run.log").read_text()


@pytest.mark.skipif(shutil.which("srun") is not None, reason="this machine has SLURM")
def test_the_slurm_launcher_off_a_cluster_is_one_line(tmp_outputs: Path, capsys) -> None:
    code, out, err = run_in_process(
        ["-m", "hydra/launcher=submitit_slurm", "model=vit", f"paths.log_dir={tmp_outputs}"], capsys
    )
    assert code == 2 and err.strip().count("\n") == 0, err
    assert err.startswith("error: hydra/launcher=submitit_slurm submits SLURM jobs, but this machine has no SLURM")


def test_a_grids_study_for_the_plots_is_made_without_optunas_banner(capfd) -> None:
    import optuna

    from zoo.app.sweep_report import study_from_records

    optuna.logging.set_verbosity(optuna.logging.INFO)  # Optuna's default
    records = [{"job": 0, "status": "completed", "value": 0.5}, {"job": 1, "status": "completed", "value": 0.7}]
    study = study_from_records(records, [["attention=full"], ["attention=local"]], "max")
    assert len(study.trials) == 2 and study.best_value == 0.7
    assert "A new study created" not in "".join(capfd.readouterr())
