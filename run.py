"""zoo's command line: `python run.py model=vit`, `python run.py -m model=gpt attention=full,local`.

Thin by design: zoo.app.cli checks the command line first and plans a resume (`auto_resume=<run dir>`),
Hydra composes conf/, zoo.app.main runs the chosen mode and returns the metric named by `optimized_metric`
(what sweepers minimise or maximise); bad input is reported as one line (zoo.app.reporting).
"""

import os
import sys

import hydra
from omegaconf import DictConfig

from zoo.app.cli import prepare_arguments
from zoo.app.launch import external_launch_overrides
from zoo.app.reporting import reporting_errors


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from zoo.app.main import main as run  # imported here: command-line mistakes are answered before torch loads

    return run(cfg)


def cli() -> None:
    """`python run.py ...`: check the command line, then Hydra; bad input exits 2 with one line."""
    with reporting_errors():
        sys.argv[1:] = prepare_arguments(sys.argv[1:])
        sys.argv += external_launch_overrides(sys.argv[1:], os.environ)  # torchrun/srun: one run directory
        main()


if __name__ == "__main__":
    cli()
