"""zoo's sweepers as Hydra plugins (Hydra instantiates sweepers only from the `hydra_plugins` package).

The work is done in zoo/app/optuna_sweeper.py and zoo/app/wandb_sweep.py, imported when a sweep starts so
that every other `python run.py` (Hydra scans this package on each start) stays free of Optuna.
Configs: conf/hydra/sweeper/zoo_optuna.yaml and conf/hydra/sweeper/wandb.yaml.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper


class ZooSweeper(Sweeper):
    """Forwards to the implementation named by `implementation` (module:Class), built from the config's settings."""

    implementation = ""

    def __init__(self, **settings: Any) -> None:
        import importlib

        module, name = self.implementation.split(":")
        self.sweeper = getattr(importlib.import_module(module), name)(**settings)

    def setup(self, **kwargs: Any) -> None:
        self.sweeper.setup(**kwargs)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)


class OptunaSweeper(ZooSweeper):
    """Optuna's ask/tell loop with pruning and resumable studies (zoo.app.optuna_sweeper)."""

    implementation = "zoo.app.optuna_sweeper:OptunaSweeper"


class WandbSweep(ZooSweeper):
    """Writes the search space as a W&B sweep config for `wandb sweep` + `wandb agent` (zoo.app.wandb_sweep)."""

    implementation = "zoo.app.wandb_sweep:WandbSweep"
