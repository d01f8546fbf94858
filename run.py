"""zoo's command line: `python run.py model=vit`, `python run.py -m model=gpt attention=full,local`.

Thin by design: Hydra composes conf/, zoo.pipeline does the work and returns the metric named by
`optimized_metric` (what sweepers minimise or maximise). zoo.cli checks the command line first, plans a
resume (`auto_resume=<run dir>`), and reports bad input as one line.
"""

import os
import sys

import hydra
from omegaconf import DictConfig

from zoo.cli import prepare_arguments, reporting_errors, run_task
from zoo.launch import external_launch_overrides


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_task(cfg)


def cli() -> None:
    """`python run.py ...`: check the command line, then Hydra; bad input exits 2 with one line."""
    with reporting_errors():
        sys.argv[1:] = prepare_arguments(sys.argv[1:])
        sys.argv += external_launch_overrides(sys.argv[1:], os.environ)  # torchrun/srun: one run directory
        main()


if __name__ == "__main__":
    cli()
