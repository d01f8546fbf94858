"""zoo's command line: `python run.py model=vit`, `python run.py -m model=gpt attention=full,local`.

Three steps to `trainer.fit`, as lightning-hydra-template's train.py: `cli` checks the command line (and plans
a resume, `auto_resume=<run dir>`), Hydra composes conf/ and calls `main`, `main` runs the mode cfg.mode names
(train: zoo.app.pipeline.train_and_test, which fits and then tests the best checkpoint). What every mode shares
(seeding, the metrics report, bad input as one line) is the decorator zoo.app.main.task_wrapper.
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
    """Hydra's task: run the chosen mode; returns the metric named by `optimized_metric` (what sweepers optimise)."""
    from zoo.app.modes import mode_named  # imported here: command-line mistakes are answered before torch loads

    return mode_named(cfg.get("mode", "train"))(cfg)


def cli() -> None:
    """`python run.py ...`: check the command line, then Hydra; bad input exits 2 with one line."""
    with reporting_errors():
        sys.argv[1:] = prepare_arguments(sys.argv[1:])
        sys.argv += external_launch_overrides(sys.argv[1:], os.environ)  # torchrun/srun: one run directory
        main()


if __name__ == "__main__":
    cli()
