"""zoo's command line as two functions: `run(overrides)` runs any mode as `python run.py <overrides>` does, and
`setup()` is what the process needs before it composes conf/ (run calls it).

The path of `python run.py model=vit` (docs/architecture.md draws it):

    run.py -> zoo.app.run -> Hydra -> zoo.app.job.run_job -> zoo.app.train.train -> trainer.fit

Kept free of torch and Lightning imports: a mistyped option is answered before they load (the job imports them).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence

import hydra
from omegaconf import DictConfig

from zoo.app.cli import RunFolders, prepare_arguments, register_resolvers
from zoo.app.launch import MULTIRUN_FLAGS, external_launch_overrides
from zoo.app.overrides import CONF
from zoo.app.reporting import reporting_errors

RUN_PY = CONF.parent / "run.py"  # what the processes Lightning starts for the other ranks execute


def setup() -> None:
    """Once a process, before conf/ is composed (calling it again changes nothing): the resolvers conf/ uses and
    the warnings that are not the user's to fix filtered. (Lightning's banners are silenced by the job, once
    Lightning is imported: zoo.app.job.prepare.)"""
    register_resolvers()
    # conf/hydra/launcher/{submitit_slurm,joblib}.yaml take the names of the plugins' structured configs on purpose
    # (users type the names they know); Hydra then validates each file against that schema and warns that this
    # matching is deprecated. The files list every field, so they also work once the matching is gone.
    warnings.filterwarnings(
        "ignore", message=r"\s*'hydra/launcher/(submitit_slurm|joblib)' is validated against ConfigStore schema"
    )
    # Lightning 2.6 on torch 2.14 warns about its own pytree use on every run.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def run(overrides: Sequence[str]) -> dict[str, float] | list[dict[str, float]]:
    """Run `python run.py <overrides>` in this process and return its metrics (a sweep, `-m`: each job's that ran
    in this process, in order); `--help` or `--cfg job` print and return {}.

    As on the command line: the command line is checked and a resume planned (`auto_resume=<run dir>`), Hydra
    composes conf/ and makes the run directory, the mode runs (zoo.app.job.run_job). Bad input ends as
    `error: <one line>` on stderr and SystemExit(2), a fault of the machine as SystemExit(3); a run refused
    before it started leaves nothing behind."""
    setup()
    folders = RunFolders()  # what this run writes before it starts, taken away again if it is refused
    results: list[dict[str, float]] = []

    @hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
    def job(cfg: DictConfig) -> float | None:
        from zoo.app.job import run_job  # torch loads here, once the command line is known to be good

        metrics, objective = run_job(cfg, folders)
        results.append(metrics)
        return objective  # what a sweeper optimises

    given = list(overrides)
    with reporting_errors(given, folders):
        arguments = prepare_arguments(given, folders)
        arguments += external_launch_overrides(arguments, os.environ)  # torchrun/srun: one run directory
        folders.register()
        with command_line(arguments):
            job()
    if any(flag in given for flag in MULTIRUN_FLAGS):
        return results
    return results[-1] if results else {}


@contextlib.contextmanager
def command_line(arguments: list[str]) -> Iterator[None]:
    """sys.argv as `python run.py <arguments>` has it, for the length of the run: Hydra reads it, and Lightning
    starts the processes of the other ranks with it."""
    saved = sys.argv
    sys.argv = [str(RUN_PY), *arguments]
    try:
        yield
    finally:
        sys.argv = saved
