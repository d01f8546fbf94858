"""`train(cfg) -> metrics`: what `python run.py` (mode=train) does, top to bottom, as lightning-hydra-template's
src/train.py: instantiate the data, the model's task, callbacks, loggers and trainer from the Hydra config; fit;
test the best checkpoint. The pieces (zoo's safety net, the checks before fit, the faults during it) are in
zoo/app/pipeline.py."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from zoo.app.pipeline import (
    complete_run_metrics,
    fitting,
    instantiate_callbacks,
    instantiate_loggers,
    instantiate_task,
    instantiate_trainer,
    prepare_checkpoint,
    print_config_tree,
    scalar_metrics,
    survivable_faults,
    test_checkpoint,
    tested_checkpoint,
)
from zoo.errors import UsageError
from zoo.training.pruning import pruned_trial

log = logging.getLogger("zoo")


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (if cfg.train), then test the best (or last) checkpoint (if cfg.test); returns every scalar metric.

    A mistake is answered before anything is written: the data is read and the checkpoint checked against the
    whole network before the config is printed and before any logger writes into the run directory."""
    test_checkpoint(cfg)  # a bad test_ckpt fails before training, not after
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    task = instantiate_task(cfg)
    callbacks = instantiate_callbacks(cfg)
    loggers = instantiate_loggers(cfg)
    trainer = instantiate_trainer(cfg, callbacks, loggers)

    # The network takes from the data what it is built with (GPT: the vocabulary); Lightning's own setup call then
    # finds the data read. The CSV logger would delete a resumed run's metrics.csv as it starts, TensorBoard open
    # a new event file: a refused resume must change nothing.
    datamodule.setup("fit" if cfg.get("train", True) else "test")
    task.take_data(datamodule)
    ckpt_path = prepare_checkpoint(cfg, task)
    if cfg.get("print_config") is not False:  # null (the default) or true: training shows its config
        print_config_tree(cfg)

    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        if ckpt_path:
            log.info(f"resuming from {ckpt_path}")
        with fitting(trainer, cfg):
            trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        metrics.update(scalar_metrics(trainer.callback_metrics))
        if ckpt_path and not metrics:  # resumed at the end of its training: fit ran no step and no validation
            metrics.update(complete_run_metrics(cfg, trainer, task, datamodule))
        if (pruned := pruned_trial(trainer)) is not None:  # stopped by its Optuna pruner: no test
            if trainer.is_global_zero:
                raise pruned  # the sweeper records the trial as PRUNED
            return metrics
        ckpt_path = tested_checkpoint(cfg, trainer)

    if cfg.get("test", True):
        if not cfg.get("train", True) and ckpt_path is None:
            raise UsageError("train=false needs ckpt_path=<checkpoint to evaluate>")
        with survivable_faults(trainer):
            trainer.test(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        metrics.update(scalar_metrics(trainer.callback_metrics))
    return metrics
