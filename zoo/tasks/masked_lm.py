"""Masked language modelling with BERT (Devlin et al. 2019, section 3.1): BERT's masking, the cross-entropy of the
chosen tokens, MLM accuracy.

Each window of the corpus (the text data GPT trains on) becomes BERT's single-segment input [CLS] text [SEP]. Of
its ordinary tokens (never [CLS], [SEP], padding or another special token) 15 % are chosen; of those 80 % become
[MASK], 10 % a random ordinary token and 10 % stay, and the loss counts the chosen positions only (labels -100
elsewhere). Training draws its masks from the global generator (seeded, and restored on resume); validation and
test mask batch i with a generator of its own, so every evaluation scores the same masked text.

The vocabulary, the longest sequence and the padding id come from the data's tokenizer (built with data.special_tokens
[MASK] [CLS] [SEP]), so the network is built in `take_data`, or in __init__ when the hyper-parameters already hold
vocab_size, as a checkpoint's do. The tokenizer travels inside every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from tokenizers import Tokenizer

from zoo.data.tokenizers import CLS, MASK, MASKED_LM_TOKENS, PAD, SEP, encode_text
from zoo.errors import AttentionPlacement, DataError
from zoo.models.bert import BERT, BERTConfig
from zoo.tasks.base import ZooTask

IGNORE_INDEX = -100  # cross_entropy's ignore_index: the positions the loss does not count


@dataclass
class MaskingConfig:
    """BERT's masking.

    Args:
        rate: the share of ordinary tokens chosen for prediction (BERT: 0.15).
        mask_rate: of the chosen, the share replaced by [MASK] (0.8).
        random_rate: of the chosen, the share replaced by a random ordinary token (0.1); the rest stay as they are.
    """

    rate: float = 0.15
    mask_rate: float = 0.8
    random_rate: float = 0.1

    def __post_init__(self) -> None:
        for name in ("rate", "mask_rate", "random_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"model.masking.{name} must be a number in [0, 1], got {value!r}")
        if self.rate == 0.0:
            raise ValueError("model.masking.rate must be above 0: with no chosen token there is nothing to learn")
        if self.mask_rate + self.random_rate > 1.0:
            raise ValueError(
                f"model.masking.mask_rate + random_rate must be at most 1, got {self.mask_rate} + {self.random_rate}"
            )


def mask_tokens(
    token_ids: torch.Tensor,
    maskable: torch.Tensor,
    mask_id: int,
    replacement_ids: torch.Tensor,
    masking: MaskingConfig | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of token_ids (B, T) -> (inputs, labels), both (B, T).

    maskable (B, T) bool: the tokens that may be chosen. Each is chosen with probability masking.rate; a chosen one
    becomes mask_id with probability mask_rate, a token drawn uniformly from replacement_ids (1-D) with probability
    random_rate, and stays otherwise. labels hold the original token at the chosen positions, -100 elsewhere.
    The draws, in this order, each of shape (B, T) from `generator`: uniform (chosen), uniform (what becomes of it),
    an index into replacement_ids.
    """
    masking = masking or MaskingConfig()
    device = token_ids.device
    chosen = (torch.rand(token_ids.shape, generator=generator, device=device) < masking.rate) & maskable
    action = torch.rand(token_ids.shape, generator=generator, device=device)
    index = torch.randint(len(replacement_ids), token_ids.shape, generator=generator, device=device)
    to_mask = chosen & (action < masking.mask_rate)
    to_random = chosen & (action >= masking.mask_rate) & (action < masking.mask_rate + masking.random_rate)
    inputs = token_ids.masked_fill(to_mask, mask_id)
    inputs = torch.where(to_random, replacement_ids.to(device)[index], inputs)
    labels = token_ids.masked_fill(~chosen, IGNORE_INDEX)
    return inputs, labels


class MaskedLMTask(ZooTask):
    """net: BERTConfig fields (vocab_size and max_length null: from the data, the tokenizer's vocabulary and
    data.block_size + 2 for [CLS] and [SEP]; padding_id: the tokenizer's <pad>); masking: MaskingConfig fields.

    lora: zoo.nn.lora.LoRAConfig fields (rank 0: off), as every task takes them (zoo.tasks.base.ZooTask).
    """

    family = "bert"
    attention_placements = (
        AttentionPlacement("every self-attention", "attention.{option}={value}", causal=False, grid=False),
    )

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        masking: dict[str, Any] | None = None,
        compile: bool = False,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(optimizer, scheduler, compile, lora)
        self.save_hyperparameters()
        self.masking = MaskingConfig(**(masking or {}))
        self.net: BERT | None = None
        self.tokenizer: Tokenizer | None = None
        if net.get("vocab_size") is not None and net.get("max_length") is not None:
            self.net = self.with_lora(BERT(BERTConfig.from_dict(net)))
        self.val_loss, self.test_loss = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()
        self.val_accuracy, self.test_accuracy = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()

    # -- model and tokenizer from the data ------------------------------------------------------------
    def setup(self, stage: str) -> None:
        self.take_data(self.attached_datamodule())

    def take_data(self, datamodule: Any) -> None:
        """The data's tokenizer (it must reserve [MASK] [CLS] [SEP]), and the network built with its vocabulary,
        its padding id and data.block_size + 2 positions (unless a checkpoint's hparams built it already)."""
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None:
            return
        missing = [token for token in (*MASKED_LM_TOKENS, PAD) if tokenizer.token_to_id(token) is None]
        if missing:
            raise DataError(
                f"the data's tokenizer has no {' '.join(missing)}: a masked language model needs them; set "
                f"data.special_tokens=[{','.join(MASKED_LM_TOKENS)}] (conf/model/bert.yaml does)"
            )
        self.tokenizer = tokenizer
        block_size = getattr(datamodule, "block_size", None)
        if self.net is None:
            net = dict(self.hparams.net)
            net["vocab_size"] = net.get("vocab_size") or tokenizer.get_vocab_size()
            net["max_length"] = net.get("max_length") or block_size + 2
            net["padding_id"] = tokenizer.token_to_id(PAD)
            self.hparams.net = net
            self.net = self.with_lora(BERT(BERTConfig.from_dict(net)))
        if self.net.config.vocab_size < tokenizer.get_vocab_size():
            raise ValueError(
                f"model.net.vocab_size={self.net.config.vocab_size} is smaller than the tokenizer's vocabulary "
                f"({tokenizer.get_vocab_size()}); set it to null (taken from the tokenizer)"
            )
        limit = self.net.max_length
        if block_size is not None and limit is not None and block_size + 2 > limit:
            raise ValueError(
                f"data.block_size={block_size} plus [CLS] and [SEP] exceeds the model's max_length={limit}; "
                f"use data.block_size <= {limit - 2} or model.net.max_length=null"
            )

    def special_ids(self) -> dict[str, int]:
        """The ids of [MASK], [CLS] and [SEP]."""
        return {token: self.tokenizer.token_to_id(token) for token in (MASK, CLS, SEP)}

    # -- masking and loss -----------------------------------------------------------------------------
    def frame(self, windows: torch.Tensor) -> torch.Tensor:
        """Windows of text (B, T) -> BERT's single-segment inputs [CLS] text [SEP] (B, T + 2)."""
        ids = self.special_ids()
        column = torch.ones_like(windows[:, :1])
        return torch.cat([column * ids[CLS], windows, column * ids[SEP]], dim=1)

    def masked_batch(
        self, windows: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) of a batch of windows: framed, then masked (`mask_tokens`) among the ordinary tokens
        (every id but the tokenizer's special tokens); a random replacement is an ordinary token too."""
        token_ids = self.frame(windows)
        decoder = self.tokenizer.get_added_tokens_decoder()
        special = torch.tensor([i for i, token in decoder.items() if token.special], device=token_ids.device)
        vocabulary = torch.arange(self.net.config.vocab_size, device=token_ids.device)
        ordinary = vocabulary[~torch.isin(vocabulary, special)]
        maskable = ~torch.isin(token_ids, special)
        return mask_tokens(token_ids, maskable, self.special_ids()[MASK], ordinary, self.masking, generator)

    def _loss_and_accuracy(self, batch: tuple[torch.Tensor, ...], generator: torch.Generator | None = None):
        inputs, labels = self.masked_batch(batch[0], generator)
        chosen = labels != IGNORE_INDEX
        logits = self.network()(inputs, masked=chosen)  # (N, vocab): the chosen positions only
        targets = labels[chosen]
        loss = F.cross_entropy(logits, targets)
        accuracy = (logits.argmax(dim=-1) == targets).float().mean()
        return loss, accuracy, targets.numel()

    def evaluation_generator(self, batch_idx: int) -> torch.Generator:
        """The masks of evaluation batch `batch_idx`: the same at every validation."""
        return torch.Generator(device=self.device).manual_seed(batch_idx)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.network()(token_ids)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.trainer.max_steps is None or self.trainer.max_steps <= 0:
            raise ValueError(
                f"trainer.max_steps must be a positive int for masked language models (training draws random "
                f"blocks, so there are no epochs), got {self.trainer.max_steps}"
            )
        return super().configure_optimizers()

    def throughput_counts(self, batch: tuple[torch.Tensor, ...]) -> dict[str, int]:
        """Samples and tokens of a training batch (zoo.training.throughput); [CLS] and [SEP] count."""
        return {"samples": batch[0].shape[0], "tokens": batch[0].numel() + 2 * batch[0].shape[0]}

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        loss, accuracy, _ = self._loss_and_accuracy(batch)
        if self.logging_this_step():
            self.log("train/loss", loss, on_step=True, prog_bar=True)
            self.log("train/mlm_acc", accuracy, on_step=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        loss, accuracy, count = self._loss_and_accuracy(batch, self.evaluation_generator(batch_idx))
        self.val_loss.update(loss, weight=count)
        self.val_accuracy.update(accuracy, weight=count)

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        loss, accuracy, count = self._loss_and_accuracy(batch, self.evaluation_generator(batch_idx))
        self.test_loss.update(loss, weight=count)
        self.test_accuracy.update(accuracy, weight=count)

    def _log_metrics(self, stage: str, loss: torchmetrics.MeanMetric, accuracy: torchmetrics.MeanMetric) -> None:
        self.log(f"{stage}/loss", loss.compute(), prog_bar=True, sync_dist=True)
        self.log(f"{stage}/mlm_acc", accuracy.compute(), prog_bar=True, sync_dist=True)
        loss.reset()
        accuracy.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_loss, self.val_accuracy)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_loss, self.test_accuracy)


@torch.no_grad()
def fill_masks(model: BERT, tokenizer: Tokenizer, text: str, k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] of `text`, in order, the k most likely tokens there and their probabilities, the text framed
    as in training ([CLS] text [SEP])."""
    ids = [tokenizer.token_to_id(token) for token in (CLS, MASK, SEP)]
    if None in ids:
        raise ValueError(f"the model's tokenizer has no {' '.join(MASKED_LM_TOKENS)}: not a masked language model's")
    cls, mask, sep = ids
    tokens = [cls, *encode_text(tokenizer, text), sep]
    if mask not in tokens:
        raise ValueError(f'{text!r} has no {MASK}; write it where a token is to be predicted, e.g. "def {MASK}(x):"')
    limit = model.max_length
    if limit is not None and len(tokens) > limit:
        raise ValueError(
            f"{text!r} is {len(tokens) - 2} tokens long, more than the model's {limit - 2} (max_length {limit} with "
            f"[CLS] and [SEP]); use a shorter text"
        )
    device = next(model.parameters()).device
    token_ids = torch.tensor([tokens], device=device)
    probabilities = model.eval()(token_ids, masked=token_ids == mask).float().softmax(dim=-1)  # (masks, vocab)
    top = probabilities.topk(min(k, probabilities.shape[-1]), dim=-1)
    return [
        [(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(values, indices)]
        for values, indices in zip(top.values, top.indices)
    ]
