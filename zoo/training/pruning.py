"""Optuna pruning in Lightning: report the monitored metric to the trial after every validation, and stop a
trial its pruner calls hopeless (median rule, successive halving, Hyperband) so its compute goes elsewhere.

The step reported to Optuna is the number of validations so far (1, 2, ...): the epochs trained for models
that validate once an epoch, the multiples of `val_check_interval` for step-based ones. Trials of one search
share the schedule, so their values are compared at the same steps even when the batch size differs.

With DDP only global rank 0 talks to the trial; its decision is broadcast, so every rank stops at the same
validation. The stop is graceful (`trainer.should_stop`, checkpoints and loggers close as usual); after fit
`pruned_trial(trainer)` returns the `TrialPruned` to raise, which the sweeper records as PRUNED, not FAIL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import optuna


class TrialPruned(optuna.TrialPruned):
    """A trial stopped by its pruner; `value` is the last value reported, `step` the validation it stopped at."""

    def __init__(self, message: str, value: float | None = None, step: int | None = None) -> None:
        super().__init__(message, value, step)  # all in args: the exception pickles to other processes intact
        self.value = value
        self.step = step

    def __str__(self) -> str:
        return str(self.args[0])


class OptunaPruning(L.Callback):
    """Reports `monitor` to an Optuna trial after each validation and stops training when the trial is pruned.

    `open_trial` returns the trial (an `optuna.Trial`); it is called once, on global rank 0, at the first
    report, so the other ranks never open the study.
    """

    def __init__(self, monitor: str, open_trial: Callable[[], Any]) -> None:
        self.monitor = monitor
        self.open_trial = open_trial
        self.validations = 0
        self.pruned: TrialPruned | None = None
        self._trial: Any = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.validations += 1
        prune, value = False, None
        if trainer.is_global_zero:
            metric = trainer.callback_metrics.get(self.monitor)
            value = None if metric is None else float(metric)
            if value is not None and math.isfinite(value):  # a NaN loss stops the run on its own
                if self._trial is None:
                    self._trial = self.open_trial()
                self._trial.report(value, self.validations)
                prune = self._trial.should_prune()
        prune, value = trainer.strategy.broadcast((bool(prune), value), src=0)
        if prune:
            shown = "n/a" if value is None else f"{value:.4g}"
            message = f"pruned at validation {self.validations} ({self.monitor} {shown})"
            self.pruned = TrialPruned(message, value, self.validations)
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}  # a resumed trial goes on counting where it stopped

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = int(state_dict.get("validations", 0))


def pruned_trial(trainer: L.Trainer) -> TrialPruned | None:
    """The `TrialPruned` of a fit its pruner stopped, None otherwise."""
    return next((c.pruned for c in trainer.callbacks if isinstance(c, OptunaPruning) and c.pruned), None)
