"""zoo's Optuna sweeper with a launcher that trains nothing (each job's result is a function of its parameters):
every setting of conf/hydra/sweeper/zoo_optuna.yaml is followed (n_trials, n_jobs, direction, storage,
max_failure_rate), results are told as COMPLETE / PRUNED / FAIL with the job's own cause, a resumed study runs
only its missing trials and adopts the one a killed sweep left RUNNING, and bad settings are one-line errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.trial import TrialState

from zoo.app.optuna_sweeper import TRIAL_ENV, OptunaSweeper
from zoo.app.sweep import FAILURE_FILE
from zoo.errors import UsageError
from zoo.training.pruning import TrialPruned

RANDOM = {"_target_": "optuna.samplers.RandomSampler", "seed": 0}
# x=1 scores 1.0, x=2 scores 2.0, x=3 is pruned, x=4 raises, x=5 logs no metric (zoo.app.sweep writes failure.txt)
SPACE = {"x": "choice(1, 2, 3, 4, 5)"}


class FakeLauncher:
    """Hydra's launcher interface: `launch(overrides per job, initial_job_idx)` -> one JobReturn per job."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.batches: list[list[list[str]]] = []
        self.first_indices: list[int] = []

    def launch(self, job_overrides: list[list[str]], initial_job_idx: int) -> list[JobReturn]:
        self.batches.append(job_overrides)
        self.first_indices.append(initial_job_idx)
        return [self.run(overrides) for overrides in job_overrides]

    def run(self, overrides: list[str]) -> JobReturn:
        values = dict(o.split("=", 1) for o in overrides)
        x = int(values["x"])
        if x == 3:
            return JobReturn(overrides, status=JobStatus.FAILED, _return_value=TrialPruned("pruned at validation 1"))
        if x == 4:
            return JobReturn(overrides, status=JobStatus.FAILED, _return_value=ValueError("boom\nsecond line"))
        if x == 5:
            job_dir = self.sweep_dir / values["hydra.sweep.subdir"]
            job_dir.mkdir(parents=True, exist_ok=True)
            (job_dir / FAILURE_FILE).write_text("optimized_metric 'val/acc' was not logged; logged metrics: []\n")
            return JobReturn(overrides, status=JobStatus.COMPLETED, _return_value=None)
        return JobReturn(overrides, status=JobStatus.COMPLETED, _return_value=float(x))


def make_sweeper(sweep_dir: Path, **settings: Any) -> tuple[OptunaSweeper, FakeLauncher]:
    """The sweeper as Hydra would set it up, with the fake launcher instead of the configured one."""
    options = dict(sampler=RANDOM, pruner=None, direction="maximize", storage=None, study_name="test",
                   n_trials=6, n_jobs=1, max_failure_rate=1.0, params=SPACE)  # fmt: skip
    sweeper = OptunaSweeper(**{**options, **settings})
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    sweeper.sweep_dir = sweep_dir
    sweeper.launcher = FakeLauncher(sweep_dir)
    return sweeper, sweeper.launcher


def study_of(url: str, name: str = "test") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def test_results_are_told_with_their_state_and_the_jobs_own_cause(tmp_path: Path) -> None:
    sweeper, launcher = make_sweeper(tmp_path, n_trials=12)
    sweeper.sweep([])
    trials = study_of(f"sqlite:///{tmp_path / 'optuna.db'}").trials  # the default storage: the sweep directory
    assert len(trials) == 12 and {t.params["x"] for t in trials} == {1, 2, 3, 4, 5}
    for trial in trials:
        x = trial.params["x"]
        expected = {1: TrialState.COMPLETE, 2: TrialState.COMPLETE, 3: TrialState.PRUNED}.get(x, TrialState.FAIL)
        assert trial.state == expected, trial
        if x in (1, 2):
            assert trial.value == x
        if x == 4:
            assert trial.user_attrs["error"] == "ValueError: boom second line"  # one line
        if x == 5:
            assert trial.user_attrs["error"].startswith("optimized_metric 'val/acc' was not logged")
    # each job: its parameters, its directory named after its trial, its trial's id for the pruning callback
    overrides = launcher.batches[0][0]
    assert overrides[0].startswith("x=") and overrides[1] == "hydra.sweep.subdir=0"
    assert overrides[2] == f"+hydra.job.env_set.{TRIAL_ENV}={trials[0]._trial_id}"
    results = OmegaConf.load(tmp_path / "optimization_results.yaml")
    assert results.best_params == {"x": 2} and results.best_value == 2.0
    assert sum(results.trials.values()) == 12


@pytest.mark.parametrize(("direction", "best"), [("maximize", 2), ("min", 1)])
def test_the_direction_picks_the_best_trial(direction: str, best: int, tmp_path: Path) -> None:
    sweeper, _ = make_sweeper(tmp_path, direction=direction, params={"x": "choice(1, 2)"}, n_trials=6)
    sweeper.sweep([])
    assert OmegaConf.load(tmp_path / "optimization_results.yaml").best_params == {"x": best}


def test_n_jobs_trials_are_launched_together_and_a_given_storage_holds_the_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    sweeper, launcher = make_sweeper(tmp_path / "sweep", n_trials=5, n_jobs=2, storage=url, study_name="shared")
    sweeper.sweep([])
    assert [len(batch) for batch in launcher.batches] == [2, 2, 1]
    assert launcher.first_indices == [0, 2, 4]  # Hydra's job numbers are the trial numbers
    assert len(study_of(url, "shared").trials) == 5 and not (tmp_path / "sweep" / "optuna.db").exists()


def test_more_failures_than_max_failure_rate_stop_the_sweep_with_the_first_cause(tmp_path: Path) -> None:
    sweeper, launcher = make_sweeper(tmp_path, params={"x": "choice(4)"}, max_failure_rate=0.0)
    with pytest.raises(UsageError, match=r"^1 of 1 trials failed .*max_failure_rate=0.0.*ValueError: boom second"):
        sweeper.sweep([])
    assert len(launcher.batches) == 1
    tolerant, launcher = make_sweeper(tmp_path / "tolerant", params={"x": "choice(4)"}, max_failure_rate=1.0)
    tolerant.sweep([])  # 1.0: every trial may fail, the search goes on
    assert len(launcher.batches) == 6


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_resumed_study_runs_only_its_missing_trials_and_adopts_an_interrupted_one(tmp_path: Path) -> None:
    first, _ = make_sweeper(tmp_path, params={"x": "choice(1, 2)"}, n_trials=3)
    first.sweep([])
    study = study_of(f"sqlite:///{tmp_path / 'optuna.db'}")
    # a sweep of this machine was killed while trial 3 ran in its directory
    interrupted = study.ask({"x": optuna.distributions.CategoricalDistribution((1, 2))})
    interrupted.set_user_attr("sweeper", {"host": socket.gethostname(), "pid": dead_pid()})
    interrupted.set_user_attr("job_dir", str((tmp_path / "3").resolve()))
    # and another machine's sweep is running trial 4: not ours to adopt
    elsewhere = study.ask({"x": optuna.distributions.CategoricalDistribution((1, 2))})
    elsewhere.set_user_attr("sweeper", {"host": "another-machine", "pid": 1})
    second, launcher = make_sweeper(tmp_path, params={"x": "choice(1, 2)"}, n_trials=5)
    second.sweep([])
    launched = [overrides for batch in launcher.batches for overrides in batch]
    assert [o[1] for o in launched] == ["auto_resume=true", "hydra.sweep.subdir=5"]  # trial 3 again, one new
    assert launched[0][0] == f"x={interrupted.params['x']}" and launched[0][2] == "hydra.sweep.subdir=3"
    states = [t.state for t in study_of(f"sqlite:///{tmp_path / 'optuna.db'}").trials]
    assert states == [TrialState.COMPLETE] * 4 + [TrialState.RUNNING, TrialState.COMPLETE]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"direction": "up"}, "unknown hydra.sweeper.direction 'up'; valid choices: maximize, minimize"),
        ({"n_trials": 0}, "hydra.sweeper.n_trials must be a positive int, got 0"),
        ({"n_jobs": "2"}, "hydra.sweeper.n_jobs must be a positive int, got '2'"),
        ({"max_failure_rate": 1.5}, "hydra.sweeper.max_failure_rate must be between 0 and 1, got 1.5"),
    ],
)
def test_bad_settings_are_one_line_errors(setting: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as error:
        make_sweeper(tmp_path, **setting)
    assert str(error.value) == message


def test_a_conditional_key_is_searched_only_in_the_trials_where_it_matters(tmp_path: Path) -> None:
    # as conf/hparams_search/*_optuna.yaml: attention.window is sampled only for attention=local
    sweeper, launcher = make_sweeper(
        tmp_path, params={"x": "choice(1, 2)", "window": "choice(4, 8)"}, conditions={"window": {"x": [2]}}, n_trials=8
    )
    sweeper.sweep([])
    trials = study_of(f"sqlite:///{tmp_path / 'optuna.db'}").trials
    assert {t.params["x"] for t in trials} == {1, 2}
    for trial in trials:
        assert ("window" in trial.params) == (trial.params["x"] == 2), trial.params
    for overrides in (o for batch in launcher.batches for o in batch):
        assert any(o.startswith("window=") for o in overrides) == ("x=2" in overrides), overrides
    with pytest.raises(UsageError, match="hydra.sweeper.conditions names 'depth', which this sweep neither searches"):
        make_sweeper(tmp_path / "bad", params={"x": "choice(1)", "window": "choice(4, 8)"},
                     conditions={"window": {"depth": [2]}})[0].sweep([])  # fmt: skip
    # a condition on a key the command line fixes is settled before the first trial
    for fixed, searched in (("x=2", True), ("x=1", False)):
        sweeper, launcher = make_sweeper(tmp_path / fixed, params={"window": "choice(4, 8)"},
                                         conditions={"window": {"x": [2]}}, n_trials=2)  # fmt: skip
        sweeper.sweep([fixed])
        jobs = [o for batch in launcher.batches for o in batch]
        assert all(any(o.startswith("window=") for o in job) == searched and fixed in job for job in jobs), jobs


def test_the_optuna_searches_sample_the_window_only_for_local_attention() -> None:
    for name in ("vit", "clip", "gpt", "translation"):
        config = OmegaConf.load(Path(__file__).parents[2] / "conf" / "hparams_search" / f"{name}_optuna.yaml")
        assert config.hydra.sweeper.conditions == {"attention.window": {"attention": ["local"]}}, name
