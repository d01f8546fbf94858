"""zoo's Optuna sweeper (`hparams_search=<model>_optuna`): Optuna's ask/tell loop around Hydra's launchers.

- Each trial is one Hydra job, on any launcher (basic, joblib, SLURM): the sweeper asks the study for
  `n_jobs` trials, launches their jobs, and tells the study each result: COMPLETE (the job's
  optimized_metric), PRUNED (its pruner stopped it: zoo/training/pruning.py), or FAIL.
- The study lives in `storage`, by default `<sweep dir>/optuna.db` (sqlite): a job in another process (joblib,
  SLURM, a DDP rank) opens its trial there to report its validation metric, and a killed sweep continues
  when started again with the same sweep directory or storage. `n_trials` counts the study's finished trials,
  so finished trials never run again; a trial that a sweep of this machine left RUNNING when it was killed
  runs again with its parameters (from its last checkpoint when its job directory is in this sweep).
- Job directories are named after trial numbers (`<sweep dir>/<trial>`): sweeps sharing one study never collide.
- The sampler and the pruner are built from their configs (`_target_` + arguments); a resumed study offsets
  the sampler's seed by the trials it already has, so its random start draws no parameters twice.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from zoo.app.search_space import DIRECTIONS, Choice, Dimension, Interval, SearchSpace, parse_search_space
from zoo.app.sweep import FAILURE_FILE
from zoo.app.sweep_report import open_storage, study_storage
from zoo.errors import UsageError, one_line
from zoo.training.pruning import OptunaPruning

log = logging.getLogger("zoo")

RESULTS_FILE = "optimization_results.yaml"
# Set for each job (hydra.job.env_set), inherited by the DDP ranks it starts: the id of its trial in the study.
TRIAL_ENV = "ZOO_OPTUNA_TRIAL_ID"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


# -- the study ------------------------------------------------------------------------------------
def optuna_distribution(dimension: Dimension) -> BaseDistribution:
    if isinstance(dimension, Choice):
        return CategoricalDistribution(dimension.values)
    if dimension.integer:
        return IntDistribution(int(dimension.low), int(dimension.high), log=dimension.log, step=dimension.step or 1)
    return FloatDistribution(dimension.low, dimension.high, log=dimension.log, step=dimension.step)


def suggest(trial: optuna.Trial, key: str, distribution: BaseDistribution) -> Any:
    """trial.suggest_* for one distribution (define-by-run: a conditional key is asked for only when it applies)."""
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(key, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    return trial.suggest_float(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)


def make_sampler(config: Any, space: SearchSpace, seed_offset: int) -> optuna.samplers.BaseSampler:
    """The sampler of `config` (`_target_` + arguments); a GridSampler gets the search space as its grid."""
    settings = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config or {})
    if settings.get("seed") is not None:
        settings["seed"] = int(settings["seed"]) + seed_offset
    if settings.get("_target_", "").endswith("GridSampler"):
        grid = {}
        for key, dimension in space.searched.items():
            if isinstance(dimension, Interval) and dimension.step is None:
                raise UsageError(f"the grid sampler needs discrete values; {key} is an interval")
            grid[key] = list(dimension.values) if isinstance(dimension, Choice) else dimension.grid()
        settings["search_space"] = grid
    return instantiate(settings)


def make_pruner(config: Any) -> optuna.pruners.BasePruner:
    if not config:
        return optuna.pruners.NopPruner()
    settings = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
    return instantiate(settings)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class OptunaSweeper:
    """The sweep: ask, launch, tell, until the study has `n_trials` finished trials (the settings are
    conf/hydra/sweeper/zoo_optuna.yaml; Hydra instantiates it through hydra_plugins/zoo_sweepers)."""

    def __init__(
        self,
        sampler: Any,
        pruner: Any,
        direction: str,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        params: Any = None,
        conditions: Any = None,
    ) -> None:
        if str(direction) not in DIRECTIONS:
            raise UsageError(f"unknown hydra.sweeper.direction {direction!r}; valid choices: maximize, minimize")
        for name, value in (("n_trials", n_trials), ("n_jobs", n_jobs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"hydra.sweeper.{name} must be a positive int, got {value!r}")
        if not 0.0 <= float(max_failure_rate) <= 1.0:
            raise UsageError(f"hydra.sweeper.max_failure_rate must be between 0 and 1, got {max_failure_rate!r}")
        self.sampler_config = sampler
        self.pruner_config = pruner
        self.direction = DIRECTIONS[str(direction)]
        self.storage = storage
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = float(max_failure_rate)
        self.params = OmegaConf.to_container(params, resolve=False) if OmegaConf.is_config(params) else params
        # searched key -> {other searched key: [values]}: the key is sampled only in trials where the other key took
        # one of those values (attention.window only for attention=local: elsewhere it would change nothing)
        conditions = OmegaConf.to_container(conditions) if OmegaConf.is_config(conditions) else conditions
        self.conditions: dict[str, dict[str, list[Any]]] = {
            key: {other: list(values) for other, values in (when or {}).items()}
            for key, when in (conditions or {}).items()
        }
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )
        self.sweep_dir = Path(str(config.hydra.sweep.dir))

    # -- the loop ---------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> None:
        assert self.config is not None and self.hydra_context is not None
        space = parse_search_space(self.params, arguments, self.hydra_context.config_loader)
        self.resolve_conditions(space)
        distributions = {key: optuna_distribution(dimension) for key, dimension in space.searched.items()}
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        url = study_storage(self.storage, self.sweep_dir)
        study = optuna.create_study(
            study_name=self.study_name,
            storage=open_storage(url),
            direction=self.direction,
            pruner=make_pruner(self.pruner_config),
            load_if_exists=True,
        )
        study.sampler = make_sampler(self.sampler_config, space, seed_offset=len(study.trials))
        stale = self.adoptable_trials(study, distributions)
        log.info(
            f"Optuna study {study.study_name!r} in {url}: {self.finished(study)} of {self.n_trials} trials finished"
            + (f", {len(stale)} interrupted trial(s) run again" if stale else "")
        )
        while (remaining := self.n_trials - self.finished(study)) > 0:
            size = min(self.n_jobs, remaining)
            batch, stale = stale[:size], stale[size:]
            batch += [self.ask(study, distributions) for _ in range(size - len(batch))]
            resumed = {trial.number for trial in batch if trial.user_attrs.get("job_dir")}
            for trial in batch:
                self.claim(trial)
            overrides = [self.job_overrides(space, trial, trial.number in resumed) for trial in batch]
            numbers = [trial.number for trial in batch]
            consecutive = numbers == list(range(numbers[0], numbers[0] + len(numbers)))
            returns = self.launcher.launch(overrides, initial_job_idx=numbers[0] if consecutive else self.job_idx)
            self.job_idx += len(returns)
            failures = [error for trial, ret in zip(batch, returns) if (error := self.tell(study, trial, ret))]
            if failures and len(failures) / len(returns) > self.max_failure_rate:
                raise UsageError(
                    f"{len(failures)} of {len(returns)} trials failed (hydra.sweeper.max_failure_rate="
                    f"{self.max_failure_rate}); the first: {failures[0]}"
                )
        self.write_results(study)

    @staticmethod
    def finished(study: optuna.Study) -> int:
        return len(study.get_trials(deepcopy=False, states=FINISHED))

    def adoptable_trials(self, study: optuna.Study, distributions: dict[str, BaseDistribution]) -> list[Any]:
        """Trials left RUNNING by a sweep of this machine that was killed: run again with their parameters.
        Those whose parameters no longer fit the search space are marked FAIL."""
        host = socket.gethostname()
        adopted = []
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = frozen.user_attrs.get("sweeper") or {}
            if owner.get("host") != host or not owner.get("pid") or process_alive(int(owner["pid"])):
                continue  # another machine's trial, or a sweep still running
            trial = optuna.Trial(study, frozen._trial_id)
            if not set(self.unconditional(distributions)) <= set(frozen.params) <= set(distributions):
                trial.set_user_attr("error", "interrupted; the search space changed before it could run again")
                study.tell(trial, state=TrialState.FAIL)
                continue
            adopted.append(trial)
        return adopted

    def resolve_conditions(self, space: SearchSpace) -> None:
        """The conditions that hold in this sweep: one on a key the command line fixes (`attention=full`) is
        settled now (the conditional key is searched in every trial, or in none: then it keeps its config value);
        one on a key neither searched nor fixed is a one-line error."""
        for key, when in list(self.conditions.items()):
            if key not in space.searched:
                del self.conditions[key]
                continue
            for other, values in list(when.items()):
                if other in space.searched:
                    continue
                if other not in space.fixed:
                    raise UsageError(
                        f"hydra.sweeper.conditions names {other!r}, which this sweep neither searches nor sets; "
                        f"searched: {', '.join(space.searched) or '(nothing)'}"
                    )
                fixed = space.fixed[other].split("=", 1)[-1]
                del when[other]
                if fixed not in [str(value) for value in values]:
                    del space.searched[key]  # never applies: the key keeps its config value
                    break
            if not when or key not in space.searched:
                del self.conditions[key]

    def unconditional(self, distributions: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
        return {key: distribution for key, distribution in distributions.items() if key not in self.conditions}

    def ask(self, study: optuna.Study, distributions: dict[str, BaseDistribution]) -> optuna.Trial:
        """A new trial: every unconditional key sampled, then each conditional key whose condition holds."""
        trial = study.ask(self.unconditional(distributions))
        for key, when in self.conditions.items():
            if all(trial.params.get(other) in values for other, values in when.items()):
                suggest(trial, key, distributions[key])
        return trial

    def claim(self, trial: optuna.Trial) -> None:
        trial.set_user_attr("sweeper", {"host": socket.gethostname(), "pid": os.getpid()})

    def job_overrides(self, space: SearchSpace, trial: optuna.Trial, resumed: bool) -> list[str]:
        """The trial's overrides, its job directory `<sweep dir>/<trial number>`, and its trial's id for the job
        (which finds the study where this sweeper does: hydra.sweeper.storage and study_name)."""
        job_dir = self.sweep_dir / str(trial.number)
        again = resumed and Path(trial.user_attrs["job_dir"]) == job_dir.resolve()
        trial.set_user_attr("job_dir", str(job_dir.resolve()))
        return [
            *space.overrides(trial.params),
            *(["auto_resume=true"] if again else []),  # continue from the job directory's last.ckpt
            f"hydra.sweep.subdir={trial.number}",
            f"+hydra.job.env_set.{TRIAL_ENV}={trial._trial_id}",
        ]

    def tell(self, study: optuna.Study, trial: optuna.Trial, ret: JobReturn) -> str | None:
        """Record a job's result in the study; returns the failure's one-line message, None otherwise."""
        if ret.status == JobStatus.FAILED:
            error = ret._return_value
            if isinstance(error, optuna.TrialPruned):
                study.tell(trial, state=TrialState.PRUNED)
                return None
            message = f"{type(error).__name__}: {one_line(str(error))}"
        elif isinstance(ret.return_value, (int, float)) and math.isfinite(ret.return_value):
            study.tell(trial, float(ret.return_value))
            return None
        else:  # zoo.app.sweep recorded why in the job directory
            failure = self.sweep_dir / str(trial.number) / FAILURE_FILE
            message = failure.read_text().strip() if failure.is_file() else f"returned {ret.return_value!r}"
        trial.set_user_attr("error", message)
        study.tell(trial, state=TrialState.FAIL)
        return message

    def write_results(self, study: optuna.Study) -> None:
        """optimization_results.yaml: the best trial's parameters and value (when a trial completed)."""
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return
        best = study.best_trial
        counts = {state.name.lower(): len(study.get_trials(deepcopy=False, states=(state,))) for state in FINISHED}
        results = {"name": "optuna", "best_params": best.params, "best_value": best.value, "best_trial": best.number}
        results.update(study_name=study.study_name, trials=counts)
        OmegaConf.save(OmegaConf.create(results), self.sweep_dir / RESULTS_FILE)
        log.info(f"Best trial {best.number}: {best.value} with {best.params}")


# -- inside a trial's job -------------------------------------------------------------------------
def trial_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """Inside an Optuna trial: the callback that reports cfg.optimized_metric to the trial after every validation
    and stops the run when the sweep's pruner says so. Outside one (no trial in the environment): none."""
    if not os.environ.get(TRIAL_ENV) or not cfg.get("optimized_metric"):
        return []
    return [OptunaPruning(monitor=str(cfg.optimized_metric), open_trial=current_trial)]


def current_trial() -> optuna.Trial:
    """The trial this job runs (its id from the environment the sweeper set), in the sweep's study, with the
    sweep's pruner (the job's own Hydra config holds the sweeper's settings)."""
    hydra = HydraConfig.get()
    study = optuna.load_study(
        study_name=str(hydra.sweeper.study_name),
        storage=open_storage(study_storage(hydra.sweeper.get("storage"), hydra.sweep.dir)),
        pruner=make_pruner(hydra.sweeper.get("pruner")),
    )
    return optuna.Trial(study, int(os.environ[TRIAL_ENV]))
