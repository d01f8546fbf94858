"""Classification: cross-entropy (optional label smoothing), top-1 accuracy and a test confusion matrix, for
images with a ViT (optionally trained on MixUp / CutMix batches) and for token sequences (the long-range tasks:
pixel sequences, ListOps) with zoo's sequence classifier."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torchvision.transforms import v2

from zoo.errors import AttentionPlacement, check_non_negative
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
from zoo.models.vit import ViT, ViTConfig, vit_from_pretrained
from zoo.tasks.base import ZooTask
from zoo.training.loggers import confusion_matrix_figure, log_image, wants_media


class ClassificationTask(ZooTask):
    """(inputs, labels) batches through `self.net` (the subclass's `build_net`) to logits.

    `mixup_alpha` / `cutmix_alpha` > 0 (images only) train on MixUp (Zhang et al. 2018) / CutMix (Yun et al. 2019)
    batches (torchvision's transforms; both: one of the two per batch, as DeiT trains): each image mixed with its
    neighbour in the batch by a Beta(alpha, alpha) share, and the loss against the mixed labels. Validation and
    test see the inputs as they are; train/acc counts a mixed image's larger share as its label.

    `eval_hflip` (images only; for classes a mirror leaves as they are, e.g. clothes, not digits): validation and
    test score each image by the mean of its and its mirror image's class probabilities (test-time augmentation);
    their loss is that mean's negative log-likelihood.
    """

    mixes_inputs = False  # whether inputs can be mixed (images); token ids cannot

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        compile: bool = False,
        pretrained: str | None = None,
        eval_hflip: bool = False,
        lora: dict[str, Any] | None = None,
    ) -> None:
        check_non_negative("model.mixup_alpha", mixup_alpha)
        check_non_negative("model.cutmix_alpha", cutmix_alpha)
        if (mixup_alpha or cutmix_alpha) and not self.mixes_inputs:
            raise ValueError(
                f"model.mixup_alpha / model.cutmix_alpha mix images; {type(self).__name__}'s inputs are token ids: "
                f"set both to 0, got {mixup_alpha} / {cutmix_alpha}"
            )
        if not isinstance(eval_hflip, bool) or (eval_hflip and not self.mixes_inputs):
            raise ValueError(
                f"model.eval_hflip mirrors images: true or false, and false for {type(self).__name__}'s token ids; "
                f"got {eval_hflip!r}"
            )
        super().__init__(optimizer, scheduler, compile, lora)
        self.save_hyperparameters()
        self.net = self.with_lora(self.build_net(net, pretrained))
        self.label_smoothing = label_smoothing
        self.eval_hflip = eval_hflip
        num_classes = self.net.config.num_classes
        mixes = [v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)] if mixup_alpha > 0 else []
        mixes += [v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)] if cutmix_alpha > 0 else []
        self.batch_mix = v2.RandomChoice(mixes) if len(mixes) > 1 else (mixes[0] if mixes else None)
        metric = lambda: torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()
        self.train_loss, self.val_loss, self.test_loss = (torchmetrics.MeanMetric() for _ in range(3))
        self.test_confusion = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=num_classes)

    def build_net(self, net: dict[str, Any], pretrained: str | None) -> torch.nn.Module:
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.network()(inputs)

    def training_targets(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch's inputs and the targets of its loss: class indices, or mixed (B, classes) labels."""
        return self.batch_mix(inputs, labels) if self.batch_mix is not None else (inputs, labels)

    def evaluation_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Validation / test scores: the logits, or with `eval_hflip` the log of the mean of the image's and its
        mirror's class probabilities (one forward pass over both)."""
        if not self.eval_hflip:
            return self(inputs)
        both = self(torch.cat([inputs, inputs.flip(-1)])).float().log_softmax(dim=-1)
        plain, mirrored = both.chunk(2)
        return torch.logaddexp(plain, mirrored) - math.log(2.0)

    def _step(self, batch: tuple[torch.Tensor, ...], stage: str) -> torch.Tensor:
        inputs, labels, *packed = batch  # packed token sequences (data.packing): their document ids too
        if packed:  # one row of logits per packed sequence
            targets, logits = labels, self.network()(inputs, document_ids=packed[0])
        else:
            inputs, targets = self.training_targets(inputs, labels) if stage == "train" else (inputs, labels)
            logits = self(inputs) if stage == "train" else self.evaluation_logits(inputs)
        loss = F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing if stage == "train" else 0.0)
        # update, not the metric's forward: that also computes each batch's own accuracy, which nobody logs
        getattr(self, f"{stage}_acc").update(logits.detach(), targets.argmax(dim=1) if targets.ndim == 2 else labels)
        getattr(self, f"{stage}_loss").update(loss.detach(), weight=len(labels))
        if stage == "test":
            self.test_confusion.update(logits, labels)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._step(batch, "train")
        if self.logging_this_step():  # the step's loss only when a logger writes it (see logging_this_step)
            self.log("train/loss_step", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")

    def _log_epoch(self, stage: str, loss_name: str) -> None:
        """Loss (mean over the epoch's samples) and accuracy of `stage`, over all ranks' samples, then reset."""
        for name, kind in ((loss_name, "loss"), (f"{stage}/acc", "acc")):
            metric = getattr(self, f"{stage}_{kind}")
            # compute() already gathered every rank's samples: the same value on each rank, so the mean that
            # sync_dist takes changes nothing (and Lightning stops asking for it under DDP)
            self.log(name, metric.compute(), prog_bar=True, sync_dist=True)
            metric.reset()

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train", "train/loss_epoch")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", "val/loss")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", "test/loss")
        confusion = self.test_confusion.compute()  # summed over all ranks: every rank must call it
        self.test_confusion.reset()
        if wants_media(self):
            names = getattr(self.trainer.datamodule, "classes", None) or None
            log_image(self, "test/confusion_matrix", confusion_matrix_figure(confusion, names))


class ImageClassificationTask(ClassificationTask):
    family = "vit"
    attention_placements = (
        AttentionPlacement("every self-attention", "attention.{option}={value}", causal=False, grid=True),
    )
    mixes_inputs = True

    def throughput_counts(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, int]:
        """Samples (images) of a training batch (zoo.training.throughput)."""
        return {"samples": len(batch[1]), "images": len(batch[1])}

    def build_net(self, net: dict[str, Any], pretrained: str | None) -> ViT:
        if not pretrained:
            return ViT(ViTConfig.from_dict(net))
        # torchvision weights or a zoo checkpoint; the checkpoint of this run then holds all weights (with LoRA:
        # what trained, naming the base).
        model, notes = vit_from_pretrained(pretrained, ViTConfig.from_dict(net))
        self.hparams.net = model.config.to_dict()  # the architecture actually built
        self.hparams.pretrained = self.lora_base(pretrained)
        for note in notes:
            print(f"pretrained: {note}")
        return model


class SequenceClassificationTask(ClassificationTask):
    """Token sequences (B, T) int64 -> one of num_classes: the long-range tasks (conf/experiment/lra_*.yaml)."""

    family = "sequence_classifier"
    attention_placements = (
        AttentionPlacement("every self-attention", "attention.{option}={value}", causal=False, grid=False),
    )

    def throughput_counts(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, int]:
        """Samples and tokens (padded positions included: the network reads them) of a training batch."""
        return {"samples": batch[0].shape[0], "tokens": batch[0].numel()}

    def build_net(self, net: dict[str, Any], pretrained: str | None) -> SequenceClassifier:
        if pretrained:
            raise ValueError("model.pretrained is for ViT weights; the sequence classifier trains from scratch (null)")
        return SequenceClassifier(SequenceClassifierConfig.from_dict(net))
