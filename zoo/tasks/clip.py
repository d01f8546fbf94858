"""CLIP training (Radford et al. 2021): symmetric InfoNCE over image-caption batches; zero-shot
classification with prompt ensembling, image<->text retrieval and a similarity picture at test time.

Data: a zoo.data.captions module (data=digits_captions | fashion_mnist_captions | image_captions). Its
tokenizer is trained on the captions, stored in every checkpoint and restored with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torchmetrics
from tokenizers import Tokenizer

from zoo.data.captions import CaptionDataModule, encode_captions, end_of_text_id
from zoo.errors import AttentionPlacement
from zoo.models.clip import CLIP, CLIPConfig
from zoo.tasks.base import ZooTask
from zoo.tasks.clip_evaluation import retrieval_metrics, similarity_figure, zero_shot_classifier
from zoo.tasks.contrastive_loss import contrastive_loss
from zoo.training.loggers import log_image


class CLIPTask(ZooTask):
    """net: a CLIPConfig as a dict. pretrained: a Hugging Face CLIP saved to disk (see CLIP.from_pretrained);
    its architecture replaces net's (net's attention still applies), and a tokenizer.json beside it (as
    CLIPProcessor.save_pretrained writes) replaces the trained tokenizer. similarity_examples: how many test
    images (one per class where there are classes) the similarity picture shows."""

    family = "clip"
    attention_placements = (
        AttentionPlacement(
            "the image tower", "model.net.attention=null +model.net.image.attention.{option}={value}", False, True
        ),
        AttentionPlacement(
            "the text tower", "model.net.attention=null +model.net.text.attention.{option}={value}", True, False
        ),
    )

    def __init__(
        self,
        net: dict[str, Any],
        pretrained: str | None = None,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        compile: bool = False,
        similarity_examples: int = 10,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(optimizer, scheduler, compile, lora)
        self.save_hyperparameters()
        self.tokenizer: Tokenizer | None = None
        if pretrained:
            tokenizer_file = Path(pretrained) if Path(pretrained).is_dir() else Path(pretrained).parent
            if Path(pretrained).exists() and not (tokenizer_file / "tokenizer.json").is_file():
                # the model's token ids mean nothing to a tokenizer trained on this run's captions
                raise ValueError(
                    f"model.pretrained={pretrained!r}: no tokenizer.json in {tokenizer_file}; save the processor "
                    "there too: CLIPProcessor.from_pretrained(<name>).save_pretrained(<that folder>)"
                )
            self.net = self.with_lora(CLIP.from_pretrained(pretrained, attention=net.get("attention")))
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file / "tokenizer.json"))
            # Checkpoints then describe the imported architecture themselves and reload without the file (with LoRA:
            # hold what trained and name it).
            self.hparams["net"], self.hparams["pretrained"] = self.net.config.to_dict(), self.lora_base(pretrained)
        else:
            self.net = self.with_lora(CLIP(CLIPConfig.from_dict(net)))
        self.similarity_examples = similarity_examples
        self.prompts: list[list[str]] = []
        self.class_embeddings: torch.Tensor | None = None
        self._test_outputs: dict[str, list] = {}

    # -- setup ----------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, CaptionDataModule):
            raise ValueError(
                f"CLIP needs image-caption data, got {type(datamodule).__name__}; valid choices: "
                "data=digits_captions | fashion_mnist_captions | image_captions"
            )
        if self.tokenizer is not None:  # pretrained or restored: the data must speak its language
            datamodule.use_tokenizer(self.tokenizer)
        self.tokenizer = datamodule.tokenizer
        self._check_tokenizer(datamodule.max_length)
        self.prompts = datamodule.zero_shot_prompts()
        if self.prompts and not hasattr(self, "val_top1"):
            num_classes = len(self.prompts[0])
            for split in ("val", "test"):
                for k in (1, 5):
                    metric = torchmetrics.Accuracy(
                        task="multiclass", num_classes=num_classes, top_k=min(k, num_classes)
                    )
                    setattr(self, f"{split}_top{k}", metric)
        if not self.prompts:
            for callback in self.trainer.checkpoint_callbacks:
                if "zero_shot" in str(getattr(callback, "monitor", "")):
                    raise ValueError(
                        f"{type(datamodule).__name__} has no class names, so no {callback.monitor}; monitor the "
                        "contrastive loss instead: model_metric.name=val/loss model_metric.mode=min"
                    )

    def _check_tokenizer(self, max_length: int) -> None:
        text = self.net.config.text
        size = self.tokenizer.get_vocab_size()
        if size > text.vocab_size:
            raise ValueError(f"the caption tokenizer has {size} tokens but model.net.text.vocab_size={text.vocab_size}")
        if max_length > text.max_length:
            raise ValueError(f"data.max_length={max_length} exceeds model.net.text.max_length={text.max_length}")
        if text.pool == "eot" and end_of_text_id(self.tokenizer) != text.eot_token_id:
            raise ValueError(
                f"the caption tokenizer ends texts with id {end_of_text_id(self.tokenizer)}, but "
                f"model.net.text.eot_token_id={text.eot_token_id}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        templates = getattr(self.attached_datamodule(), "templates", ())
        if templates:  # the prompts of zero-shot classification, the default of mode=zero_shot
            checkpoint["templates"] = list(templates)

    # -- inference ------------------------------------------------------------------------------------
    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.network()(images, tokens)

    # -- training -------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        image_features, text_features, logit_scale = self(batch["images"], batch["tokens"])
        loss = contrastive_loss(image_features, text_features, logit_scale)
        size = len(batch["captions"])
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size)
        self.log("train/logit_scale", logit_scale, on_step=True, on_epoch=False, batch_size=size)
        return loss

    def throughput_counts(self, batch: dict[str, Any]) -> dict[str, int]:
        """Image-caption pairs, images and caption tokens (padding included) of a training batch."""
        size = len(batch["captions"])
        return {"samples": size, "images": size, "tokens": batch["tokens"].numel()}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # As OpenAI and open_clip do: keep the parameter itself inside [0, ln 100] so it can always move back.
        with torch.no_grad():
            self.net.logit_scale.clamp_(0.0, self.net.config.logit_scale_max)

    # -- evaluation -----------------------------------------------------------------------------------
    def _prepare_zero_shot(self) -> None:
        self.class_embeddings = None
        if self.prompts:
            tokens = [encode_captions(self.tokenizer, row).to(self.device) for row in self.prompts]
            self.class_embeddings = zero_shot_classifier(self.net, tokens)

    def _evaluate(self, batch: dict[str, Any], stage: str) -> tuple[torch.Tensor, torch.Tensor]:
        image_features, text_features, logit_scale = self(batch["images"], batch["tokens"])
        size = len(batch["captions"])
        loss = contrastive_loss(image_features, text_features, logit_scale)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        if self.class_embeddings is not None:
            logits = image_features @ self.class_embeddings.T
            for k in (1, 5):
                metric = getattr(self, f"{stage}_top{k}")
                metric(logits, batch["labels"])
                self.log(f"{stage}/zero_shot_top{k}", metric, on_epoch=True, prog_bar=k == 1)
        return image_features, text_features

    def on_validation_epoch_start(self) -> None:
        self._prepare_zero_shot()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_test_epoch_start(self) -> None:
        self._prepare_zero_shot()
        self._test_outputs = {"images": [], "texts": [], "match_ids": [], "examples": []}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        image_features, text_features = self._evaluate(batch, "test")
        outputs = self._test_outputs
        outputs["images"].append(image_features)
        outputs["texts"].append(text_features)
        outputs["match_ids"].append(batch["match_ids"])
        # Examples for the similarity picture: the first test image of each match id (class).
        seen = {example[3] for example in outputs["examples"]}
        for i, match_id in enumerate(batch["match_ids"].tolist()):
            if len(outputs["examples"]) < self.similarity_examples and match_id not in seen:
                seen.add(match_id)
                picture, caption = batch["images"][i].cpu(), batch["captions"][i]
                outputs["examples"].append((picture, caption, image_features[i], match_id, text_features[i]))

    def on_test_epoch_end(self) -> None:
        outputs = self._test_outputs
        if not outputs.get("images"):
            return
        gathered = [torch.cat(outputs[key]) for key in ("images", "texts", "match_ids")]
        if self.trainer.world_size > 1:
            gathered = [self.all_gather(tensor).flatten(0, 1) for tensor in gathered]
        images, texts, match_ids = gathered
        for name, value in retrieval_metrics(images, texts, match_ids, match_ids).items():
            self.log(f"test/{name}", value)
        if outputs["examples"] and self.trainer.is_global_zero:
            self._log_similarity_figure(outputs["examples"])
        self._test_outputs = {}

    def _log_similarity_figure(self, examples: list[tuple]) -> None:
        pictures, captions, image_features, _, text_features = zip(*examples)
        similarity = torch.stack(text_features) @ torch.stack(image_features).T  # (captions, images)
        figure = similarity_figure(torch.stack(pictures), captions, similarity)
        path = Path(self.trainer.default_root_dir) / "clip_similarity.png"
        log_image(self, "test/similarity", figure, save_path=path)
