"""The Lightning pruning callback reports the monitored metric to its Optuna trial after every validation (the
step: validations so far), stops training when the pruner says so, follows rank 0's decision on every rank,
and its TrialPruned survives the trip to another process."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import optuna
import pytest
import torch

from zoo.training.pruning import OptunaPruning, TrialPruned, pruned_trial


def fake_trainer(value: float, rank_zero: bool = True, decision: bool | None = None) -> SimpleNamespace:
    """What the callback reads from a Trainer; `decision` is what rank 0 broadcast (for ranks > 0)."""

    def broadcast(obj, src=0):
        return obj if decision is None else (decision, obj[1])

    return SimpleNamespace(
        sanity_checking=False,
        is_global_zero=rank_zero,
        callback_metrics={"val/loss": torch.tensor(value)},
        strategy=SimpleNamespace(broadcast=broadcast),
        should_stop=False,
    )


def test_reports_each_validation_and_stops_when_the_pruner_says_so() -> None:
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    done = study.ask()
    for step, value in enumerate([1.0, 0.5, 0.2], start=1):
        done.report(value, step)
    study.tell(done, 0.2)
    trial = study.ask()
    opened = []
    callback = OptunaPruning("val/loss", open_trial=lambda: opened.append(1) or trial)
    callback.on_validation_end(fake_trainer(0.75), None)  # better than the median at validation 1
    assert callback.validations == 1 and callback.pruned is None
    trainer = fake_trainer(2.0)  # worse than every completed trial at validation 2
    callback.on_validation_end(trainer, None)
    assert study.trials[1].intermediate_values == {1: 0.75, 2: 2.0}
    assert trainer.should_stop and isinstance(callback.pruned, optuna.TrialPruned)
    assert str(callback.pruned) == "pruned at validation 2 (val/loss 2)"
    assert (callback.pruned.value, callback.pruned.step) == (2.0, 2)
    assert opened == [1]  # the trial is opened once
    assert pruned_trial(SimpleNamespace(callbacks=[object(), callback])) is callback.pruned


def test_sanity_check_and_missing_metric_report_nothing() -> None:
    callback = OptunaPruning("val/acc", open_trial=lambda: pytest.fail("nothing to report"))
    trainer = fake_trainer(1.0)
    trainer.sanity_checking = True
    callback.on_validation_end(trainer, None)
    assert callback.validations == 0
    callback.on_validation_end(fake_trainer(1.0), None)  # val/acc was not logged
    assert callback.validations == 1 and callback.pruned is None


@pytest.mark.parametrize("decision", [True, False])
def test_other_ranks_follow_rank_zero_and_never_open_the_trial(decision: bool) -> None:
    callback = OptunaPruning("val/loss", open_trial=lambda: pytest.fail("only rank 0 opens the trial"))
    trainer = fake_trainer(1.0, rank_zero=False, decision=decision)
    callback.on_validation_end(trainer, None)
    assert trainer.should_stop is decision and (callback.pruned is not None) is decision


def test_the_count_of_validations_is_restored_with_a_checkpoint_and_trial_pruned_pickles() -> None:
    callback = OptunaPruning("val/loss", open_trial=lambda: None)
    callback.load_state_dict({"validations": 3})
    assert callback.state_dict() == {"validations": 3}
    error = pickle.loads(pickle.dumps(TrialPruned("pruned at validation 2 (val/loss 2)", 2.0, 2)))
    assert isinstance(error, optuna.TrialPruned) and (str(error), error.value, error.step) == (
        "pruned at validation 2 (val/loss 2)", 2.0, 2)  # fmt: skip
