"""Hydra sweeps (`python run.py -m ...`, `hparams_search=<model>_optuna`): failed trials, summary table, report.

- A trial that fails (an exception, or an optimized metric that is missing or not finite) is recorded
  in its job directory (`failure.txt`) and returns None: the grid goes on, and Optuna marks the trial
  FAIL and samples the next one (conf/hydra/sweeper/zoo_optuna.yaml: max_failure_rate 1.0). A trial its
  Optuna pruner stopped is raised on to the sweeper, which records it PRUNED.
- `SweepSummary` (a Hydra callback, conf/hydra/default.yaml) writes `job.json` into every job directory
  and, at the end, prints one table (job, overrides, optimized metric) and saves it as `summary.csv`
  in the sweep directory, with the plots and, with logger=wandb, a W&B summary run (zoo/app/sweep_report.py).
  It reads the job files, so it works with every launcher (basic, joblib, SLURM). A sweep whose jobs all
  failed ends with the first job's error as one line and exit status 2; a grid with some failed jobs finishes
  the others, then ends the same way with exit status 1.
- `SweepJobs` (also a Hydra callback) lets `${hydra:...}` resolve in the sweep directory's name, and a
  sweep job train with DDP: Lightning restarts the script for ranks > 0 with the original command line,
  which for a sweep is the whole sweep again. It also refuses the SLURM launcher where there is no SLURM.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write

from zoo.app.reporting import EXIT_BAD_INPUT, user_error_message
from zoo.app.sweep_report import log_sweep_to_wandb, save_sweep_plots, sweep_study
from zoo.errors import one_line

EXIT_PARTLY_FAILED = 1  # a grid finished, but some of its jobs failed

log = logging.getLogger("zoo")

FAILURE_FILE = "failure.txt"
JOB_FILE = "job.json"
SUMMARY_FILE = "summary.csv"


def _job_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def trial_failed(error: BaseException) -> None:
    """Record a sweep job's exception (full traceback in the job log, one line in failure.txt); the sweep goes on.
    A trial stopped by its Optuna pruner is no failure: it is raised on to the sweeper, which records it PRUNED."""
    if is_pruned(error):
        log.info("trial %s", error)
        raise error
    message = user_error_message(error) or f"{type(error).__name__}: {one_line(str(error))}".rstrip(": ")
    log.error("trial failed, the sweep goes on: %s", message)
    to_log_files_only(f"the trial's traceback:\n{''.join(traceback.format_exception(error)).rstrip()}")
    (_job_dir() / FAILURE_FILE).write_text(message + "\n")
    return None


def to_log_files_only(text: str) -> None:
    """`text` into the job's log files (Hydra's run.log), not onto the console: a grid's console keeps one line
    per failed job, its tracebacks are in each job's run.log."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def is_pruned(error: Any) -> bool:
    """Whether a job ended because its Optuna pruner stopped it (an optuna.TrialPruned, so optuna is loaded)."""
    optuna = sys.modules.get("optuna")
    return optuna is not None and isinstance(error, optuna.TrialPruned)


def job_number(config: DictConfig) -> int:
    """The job directory's name when it is a number (an Optuna sweep names it after the trial), else hydra.job.num."""
    name = Path(config.hydra.runtime.output_dir).name
    return int(name) if name.isdigit() else int(config.hydra.job.num)


def trial_objective(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value a sweeper optimises: metrics[cfg.optimized_metric], or None (a failed trial) when that
    metric was not logged or is not finite (a diverged run must not win, nor crash Optuna with NaN)."""
    name = cfg.get("optimized_metric")
    if not name:
        return None
    value = metrics.get(name)
    if value is None:
        message = f"optimized_metric {name!r} was not logged; logged metrics: {sorted(metrics)}"
    elif not math.isfinite(value):
        message = f"optimized_metric {name!r} is {value}"
    else:
        return value
    log.error("trial failed, the sweep goes on: %s", message)
    (_job_dir() / FAILURE_FILE).write_text(message + "\n")
    return None


class SweepSummary(Callback):
    """Per job: `job.json` (job, overrides, metric, value, status, error). After the sweep: the table."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job_dir = Path(config.hydra.runtime.output_dir)
        record: dict[str, Any] = {
            "job": job_number(config),
            # the sweeper's own settings for the job (hydra.sweep.subdir, hydra.job.env_set) are not the trial's
            "overrides": [o for o in job_return.overrides or [] if not o.lstrip("+~").startswith("hydra.")],
            "metric": config.get("optimized_metric"),
            "value": None,
            "status": "completed",
            "error": None,
        }
        if job_return.status == JobStatus.FAILED:
            error = job_return._return_value
            if is_pruned(error):
                record.update(status="pruned", value=getattr(error, "value", None))
            else:
                record.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0])
        else:
            value = job_return.return_value
            record["value"] = float(value) if isinstance(value, (int, float)) else None
            failure = job_dir / FAILURE_FILE
            if failure.is_file():
                record.update(status="failed", error=failure.read_text().strip())
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / JOB_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        records = sorted(
            (json.loads(path.read_text()) for path in sweep_dir.glob(f"**/{JOB_FILE}")),
            key=lambda record: record["job"],
        )
        if not records:
            return
        mode = (config.get("model_metric") or {}).get("mode", "min")
        write_summary_csv(records, sweep_dir / SUMMARY_FILE)
        print_summary(records, mode, sweep_dir)
        plots = save_sweep_plots(sweep_study(config, records, varying_overrides(records), mode), sweep_dir)
        if "wandb" in (config.get("logger") or {}):
            log_sweep_to_wandb(config, records, plots, best_job(records, mode))
        failed = [record for record in records if record["status"] == "failed"]
        if len(failed) == len(records):
            first = records[0]
            stop_sweep(f"all {len(records)} jobs of the sweep failed; job {first['job']}: {first['error']}")
        if failed and not searches(config):  # a search samples on past failures; a grid asked for every job
            first = failed[0]
            stop_sweep(
                f"{len(failed)} of {len(records)} jobs of the sweep failed (the others finished: "
                f"{sweep_dir / SUMMARY_FILE}); job {first['job']}: {first['error']}",
                status=EXIT_PARTLY_FAILED,
            )


def searches(config: DictConfig) -> bool:
    """Whether the sweeper is a search (Optuna, a W&B sweep), whose failed trials are part of searching, rather
    than a grid, which was asked for every one of its jobs."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    return "optuna" in target.lower() or "wandb" in target.lower()


def varying_overrides(records: list[dict[str, Any]]) -> list[list[str]]:
    """Each job's overrides without those every job shares (the sweep's fixed settings)."""
    if len(records) < 2:
        return [record["overrides"] for record in records]
    shared = set.intersection(*(set(record["overrides"]) for record in records))
    return [[o for o in record["overrides"] if o not in shared] for record in records]


def best_job(records: list[dict[str, Any]], mode: str) -> int | None:
    scored = [r for r in records if r["status"] == "completed" and r["value"] is not None]
    if not scored:
        return None
    pick = max if mode == "max" else min
    return pick(scored, key=lambda r: r["value"])["job"]


def write_summary_csv(records: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job", "status", "metric", "value", "overrides", "error"])
        for record in records:
            value = "" if record["value"] is None else repr(record["value"])
            writer.writerow(
                [
                    record["job"],
                    record["status"],
                    record["metric"] or "",
                    value,
                    " ".join(record["overrides"]),
                    record["error"] or "",
                ]
            )


def print_summary(records: list[dict[str, Any]], mode: str, sweep_dir: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    metric = next((r["metric"] for r in records if r["metric"]), None) or "value"
    best = best_job(records, mode)
    failed = sum(record["status"] == "failed" for record in records)
    pruned = sum(record["status"] == "pruned" for record in records)
    counts = f"{failed} failed" + (f", {pruned} pruned" if pruned else "")
    title = escape(f"sweep: {len(records)} jobs, {counts} ({mode} {metric})")
    table = Table(title=title, title_justify="left")
    table.add_column("job", justify="right")
    table.add_column("overrides")
    table.add_column(escape(metric), justify="right")
    if failed:
        table.add_column("error", overflow="fold")
    for record, overrides in zip(records, varying_overrides(records)):
        overrides = [escape(override) for override in overrides]
        if record["status"] == "failed":
            value = "[red]failed[/red]"
        elif record["status"] == "pruned":
            value = ("-" if record["value"] is None else f"{record['value']:.4f}") + " [yellow]pruned[/yellow]"
        elif record["value"] is None:
            value = "-"
        else:
            value = f"{record['value']:.4f}" + (" [bold green]*best[/bold green]" if record["job"] == best else "")
        row = [str(record["job"]), " ".join(overrides) or "(none)", value]
        table.add_row(*row, *([escape(record["error"] or "")] if failed else []))
    console = Console(width=max(120, Console().width))
    console.print(table)
    console.print(f"saved {sweep_dir / SUMMARY_FILE}")


class SweepJobs(Callback):
    """Makes a sweep's settings resolvable and its jobs independent (DDP, W&B) when they share a process.

    - Before the sweeper starts, HydraConfig is set, so `${hydra:...}` interpolations (paths.root_dir,
      task_name) resolve in hydra.sweep.dir; Hydra itself sets it only inside each job.
    - Lightning starts DDP ranks > 0 as `python <script> <sys.argv[1:]> hydra.run.dir=<HydraConfig run.dir>`.
      In a sweep both are wrong: the arguments are the whole sweep (-m, a,b,c) and run.dir is not the
      job's directory. For the job's duration, sys.argv becomes the job's own overrides in run mode and
      run.dir the job directory. When the job ends, both are restored, the job's process group is destroyed
      and Lightning's DDP environment variables are reset, so the next job of the sweep starts its own.
    - A job's W&B run is finished when the job ends; otherwise the next job would log into it.
    """

    # Hydra options (not overrides) that must reach the restarted script: the config it composes.
    CONFIG_OPTIONS = ("-cp", "-cn", "-cd", "--config-path", "--config-name", "--config-dir")

    # Set in this process by Lightning's DDP launcher; left behind, the next job would think that someone
    # else started its processes (LOCAL_RANK) and wait forever for ranks that never come.
    DISTRIBUTED_ENV = (
        "LOCAL_RANK",
        "NODE_RANK",
        "GROUP_RANK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    )

    def __init__(self) -> None:
        self._argv: list[str] | None = None
        self._environ: dict[str, str | None] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        OmegaConf.set_readonly(config.hydra, None)  # set_config makes it read-only; sweepers may still write
        check_launcher(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        self._argv = list(sys.argv)
        self._environ = {name: os.environ.get(name) for name in self.DISTRIBUTED_ENV}
        options = []
        args = iter(sys.argv[1:])
        for arg in args:
            if arg in self.CONFIG_OPTIONS:
                options += [arg, next(args, "")]
            elif arg.split("=", 1)[0] in self.CONFIG_OPTIONS:
                options.append(arg)
        overrides = [str(override) for override in config.hydra.overrides.task]
        sys.argv = [sys.argv[0], *options, *overrides, "hydra.mode=RUN"]
        run = HydraConfig.instance().cfg.hydra.run
        with read_write(run):
            run.dir = str(config.hydra.runtime.output_dir)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self._argv is not None:
            sys.argv = self._argv
            self._argv = None
        for name, value in self._environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._environ = {}
        # A W&B run stays open until finished: the next job would log into this one.
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()
        # The next job in this process starts its own process group: the last one's peers have exited.
        distributed = sys.modules.get("torch.distributed")
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            distributed.destroy_process_group()


def check_launcher(config: DictConfig) -> None:
    """hydra/launcher=submitit_slurm off a cluster: one line instead of submitit's traceback at the first job."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
    if target.endswith("SlurmLauncher") and shutil.which("srun") is None:
        stop_sweep(
            "hydra/launcher=submitit_slurm submits SLURM jobs, but this machine has no SLURM (no srun); "
            "run it on a cluster's login node, or here with hydra/launcher=basic or joblib"
        )


def stop_sweep(message: str, status: int = EXIT_BAD_INPUT) -> NoReturn:
    """End the sweep with `error: <message>` and exit status 2 (or `status`). An exception would not do:
    Hydra turns a callback's exceptions into warnings."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)
