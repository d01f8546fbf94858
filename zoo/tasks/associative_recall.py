"""Multi-query associative recall (zoo/data/mqar.py) as a causal language model: the GPT task, scored by its
accuracy on the queries alone (Zoology's metric), as val/acc and test/acc."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchmetrics

from zoo.data.mqar import IGNORE
from zoo.tasks.language_model import LanguageModelTask


class AssociativeRecallTask(LanguageModelTask):
    """LanguageModelTask (its net, optimizer, scheduler) plus the share of queries whose value the model predicts
    (argmax at the query's position); the loss is counted on the queries too (every other target is IGNORE).

    The head runs at the queries only (the net's `scored` argument): the loss is the same mean over the same
    targets, and the (B, T, vocabulary) logits of every other position are never formed. At Zoology's vocabulary
    of 8192 they were most of a step (measured: experiments/results/variant_study_checks.md).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.val_acc, self.test_acc = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()

    def _queries(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (N, vocab), values (N,)) of the batch's N queries."""
        x, y = batch
        scored = y != IGNORE
        return self.network()(x, scored=scored), y[scored]

    def _loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return F.cross_entropy(*self._queries(batch))

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], loss: torchmetrics.MeanMetric,
                  accuracy: torchmetrics.MeanMetric) -> None:  # fmt: skip
        logits, values = self._queries(batch)
        loss.update(F.cross_entropy(logits, values), weight=values.numel())
        accuracy.update((logits.argmax(dim=-1) == values).float().mean(), weight=values.numel())

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_loss, self.test_acc)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self.log("val/acc", self.val_acc.compute(), prog_bar=True, sync_dist=True)
        self.val_acc.reset()

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self.log("test/acc", self.test_acc.compute(), prog_bar=True, sync_dist=True)
        self.test_acc.reset()
