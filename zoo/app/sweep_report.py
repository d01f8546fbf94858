"""The end of a sweep, beyond its table: plots in the sweep directory and, with logger=wandb, one W&B summary run.

- Plots (Optuna's matplotlib visualisations): `optimization_history.png` (each trial's value and the best so
  far), `parallel_coordinates.png` (each trial's parameters and value), `param_importances.png` (fANOVA
  importances, Hutter et al. 2014). An Optuna sweep plots its study (every trial, resumed ones too); a grid
  is read into an in-memory study from its jobs' overrides first.
- The W&B summary run holds the summary table and these pictures, in the group of the sweep's runs.
- Where a study lives (`study_storage`, `open_storage`) is decided here, for the sweeper and the report alike.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.training.loggers import log_sweep_summary, sweep_group

log = logging.getLogger("zoo")

STUDY_FILE = "optuna.db"
PLOTS = {
    "optimization_history": "plot_optimization_history",
    "parallel_coordinates": "plot_parallel_coordinate",
    "param_importances": "plot_param_importances",
}
TABLE_COLUMNS = ["job", "status", "metric", "value", "overrides", "error"]


# -- where a study lives --------------------------------------------------------------------------
def study_storage(storage: str | None, sweep_dir: str | Path) -> str:
    """The study's database URL: `storage`, or sqlite in the sweep directory."""
    return storage or f"sqlite:///{(Path(sweep_dir) / STUDY_FILE).resolve()}"


def open_storage(url: str) -> Any:
    """Optuna's storage for `url`; sqlite waits up to a minute for a lock (parallel jobs report at once)."""
    import optuna

    if url.startswith("sqlite:"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return url


def is_optuna_sweep(config: DictConfig) -> bool:
    return str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("zoo_sweepers.OptunaSweeper")


# -- the study behind the plots ---------------------------------------------------------------------
def sweep_study(config: DictConfig, records: list[dict[str, Any]], overrides: list[list[str]], mode: str) -> Any:
    """The Optuna study of an Optuna sweep, or the grid's jobs (with their varying `overrides`) as a study."""
    import optuna

    if is_optuna_sweep(config):
        sweeper = config.hydra.sweeper
        url = study_storage(sweeper.get("storage"), config.hydra.sweep.dir)
        return optuna.load_study(study_name=str(sweeper.study_name), storage=open_storage(url))
    return study_from_records(records, overrides, mode)


def parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def study_from_records(records: list[dict[str, Any]], overrides: list[list[str]], mode: str) -> Any:
    """A grid's jobs as trials: the overrides that vary (`key=value`) are the parameters, numeric ones as ranges."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import TrialState

    params = [dict(o.split("=", 1) for o in job if "=" in o) for job in overrides]
    params = [{key.lstrip("+~"): parse_value(value) for key, value in p.items()} for p in params]
    values: dict[str, set[Any]] = {}
    for trial_params in params:
        for key, value in trial_params.items():
            values.setdefault(key, set()).add(value)
    distributions = {}
    for key, seen in values.items():
        if all(isinstance(v, int) for v in seen) and len(seen) > 1:
            distributions[key] = IntDistribution(min(seen), max(seen))
        elif all(isinstance(v, (int, float)) for v in seen) and len(seen) > 1:
            distributions[key] = FloatDistribution(float(min(seen)), float(max(seen)))
        else:
            distributions[key] = CategoricalDistribution(sorted(map(str, seen)))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory": a study for plots only
    try:
        study = optuna.create_study(direction="maximize" if mode == "max" else "minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    states = {"completed": TrialState.COMPLETE, "pruned": TrialState.PRUNED}
    for record, trial_params in zip(records, params):
        state = states.get(record["status"], TrialState.FAIL)
        value = record["value"] if state == TrialState.COMPLETE else None
        if state == TrialState.COMPLETE and (value is None or not math.isfinite(value)):
            state = TrialState.FAIL
        shown = {
            key: str(value) if isinstance(distributions[key], CategoricalDistribution) else value
            for key, value in trial_params.items()
        }
        trial = optuna.trial.create_trial(
            params=shown, distributions={key: distributions[key] for key in shown}, value=value, state=state
        )
        study.add_trial(trial)
    return study


# -- plots --------------------------------------------------------------------------------------------
def save_sweep_plots(study: Any, sweep_dir: Path) -> dict[str, Path]:
    """Optuna's three plots of `study` as PNGs in the sweep directory; a plot the study cannot make yet (too
    few completed trials, nothing varied) is left out with a note."""
    import matplotlib.pyplot as plt
    import optuna
    from optuna.trial import TrialState

    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    keys = {key for trial in completed for key in trial.params}
    varied = {key for key in keys if len({str(trial.params.get(key)) for trial in completed}) > 1}
    needs = {
        "optimization_history": (len(completed) >= 1, "a completed trial"),
        "parallel_coordinates": (len(completed) >= 1 and bool(keys), "a completed trial with parameters"),
        "param_importances": (len(completed) >= 2 and bool(varied), "two completed trials and a varied parameter"),
    }
    saved = {}
    for name, function in PLOTS.items():
        possible, what = needs[name]
        if not possible:
            log.info(f"sweep plot {name} left out: it needs {what}")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's matplotlib plots are "experimental"; flat axes are fine
            axes = getattr(optuna.visualization.matplotlib, function)(study)
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        path = sweep_dir / f"{name}.png"
        figure.set_size_inches(max(8.0, figure.get_figwidth()), max(5.0, figure.get_figheight()))
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        saved[name] = path
    if saved:
        print(f"saved plots: {', '.join(str(p) for p in saved.values())}")
    return saved


# -- W&B --------------------------------------------------------------------------------------------
def log_sweep_to_wandb(
    config: DictConfig, records: list[dict[str, Any]], plots: dict[str, Path], best: int | None
) -> None:
    """One W&B run for the whole sweep (`<sweep>/summary`, in the sweep's group): the table and the plots."""
    wandb = config.logger.wandb
    sweep_dir = Path(str(config.hydra.sweep.dir))
    rows = [
        [r["job"], r["status"], r["metric"] or "", r["value"], " ".join(r["overrides"]), r["error"] or ""]
        for r in records
    ]
    best_record = next((r for r in records if r["job"] == best), None)
    summary = {"sweep/jobs": len(records), **{f"sweep/{s}": sum(r["status"] == s for r in records) for s in
                                                ("completed", "failed", "pruned")}}  # fmt: skip
    if best_record is not None:
        summary.update({"sweep/best_job": best, "sweep/best_value": best_record["value"]})
        summary["sweep/best_overrides"] = " ".join(best_record["overrides"])
    log_sweep_summary(
        save_dir=sweep_dir,
        project=wandb.get("project"),
        entity=wandb.get("entity"),
        group=sweep_group(wandb.get("group"), sweep_dir.name),
        name=f"{sweep_dir.name}/summary",
        tags=[*(wandb.get("tags") or []), f"sweep:{sweep_dir.name}"],
        columns=TABLE_COLUMNS,
        rows=rows,
        images=plots,
        summary=summary,
        config={"sweeper": OmegaConf.to_container(config.hydra.sweeper, resolve=True), "sweep_dir": str(sweep_dir)},
    )
