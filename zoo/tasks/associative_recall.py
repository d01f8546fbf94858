"""Multi-query associative recall (zoo/data/mqar.py) as a causal language model: the GPT task, scored by its
accuracy on the queries alone (Zoology's metric), as val/acc and test/acc."""

from __future__ import annotations

import torch
import torchmetrics

from zoo.data.mqar import IGNORE
from zoo.tasks.language_model import LanguageModelTask


class AssociativeRecallTask(LanguageModelTask):
    """LanguageModelTask (its net, optimizer, scheduler) plus the share of queries whose value the model predicts
    (argmax at the query's position); the loss is counted on the queries too (every other target is IGNORE)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.val_acc, self.test_acc = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()

    def _accuracy(self, batch: tuple[torch.Tensor, torch.Tensor], metric: torchmetrics.MeanMetric) -> None:
        x, y = batch
        scored = y != IGNORE
        predicted = self.network()(x).argmax(dim=-1)  # (B, T)
        metric.update((predicted[scored] == y[scored]).float().mean(), weight=int(scored.sum()))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self._accuracy(batch, self.val_acc)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        self._accuracy(batch, self.test_acc)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self.log("val/acc", self.val_acc.compute(), prog_bar=True, sync_dist=True)
        self.val_acc.reset()

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self.log("test/acc", self.test_acc.compute(), prog_bar=True, sync_dist=True)
        self.test_acc.reset()
