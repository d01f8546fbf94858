"""Translation with the encoder-decoder Transformer: label-smoothed cross-entropy, BLEU, beam search.

Training follows Vaswani et al. 2017 (section 5): Adam (0.9, 0.98), inverse-sqrt warmup schedule,
label smoothing 0.1 (padding ignored). Validation decodes greedily (fast) for `val/bleu`; test decodes
with beam search and greedily, both scored with sacrebleu on detokenized text against the raw
references. A few sample translations and a cross-attention alignment heatmap are logged each epoch.

A checkpoint carries the tokenizer: `zoo.load` rebuilds model and tokenizer from it (what `python run.py
model=translation mode=translate ckpt_path=... 'text="Ein Mann fährt Fahrrad."'` uses).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from zoo.data.parallel_text import decode_ids
from zoo.data.tokenizers import BOS, EOS, PAD
from zoo.errors import AttentionPlacement, DataError
from zoo.models.rnn_translation import ATTENTIONS, RNNTranslation, RNNTranslationConfig
from zoo.models.seq2seq import Seq2SeqModel, beam_search, greedy_decode
from zoo.models.translation import TranslationConfig, TranslationTransformer
from zoo.tasks.base import ZooTask
from zoo.training.loggers import heatmap_figure, log_image, log_text_table

log = logging.getLogger("zoo")


def label_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float, pad_id: int):
    """Mean over non-padding tokens of the cross-entropy against (1 - eps) one-hot + eps uniform
    (Szegedy et al. 2016), and the plain NLL for reporting. logits (B, T, V), targets (B, T)."""
    logits, targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    loss = F.cross_entropy(logits, targets, ignore_index=pad_id, label_smoothing=smoothing)
    nll = F.cross_entropy(logits.detach(), targets, ignore_index=pad_id) if smoothing else loss.detach()
    return loss, nll


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacrebleu's corpus BLEU (13a tokenization) on detokenized text."""
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Readable BPE pieces for plot axes: each piece decoded on its own (so 'fÃ¼nf' reads 'fünf'),
    a leading space shown as '▁'."""
    labels = []
    for i in ids:
        piece = tokenizer.decode([i], skip_special_tokens=False)
        labels.append("▁" + piece[1:] if piece.startswith(" ") else piece)
    return labels


def alignment_figure(
    net: Seq2SeqModel, tokenizer: Tokenizer, source_ids: list[int], target_ids: list[int], title: str = ""
):
    """Cross-attention of the last decoder layer, averaged over heads, for one translated sentence, or None for
    a model without attention (the fixed-vector RNN). source_ids end in EOS; target_ids are the translation
    without BOS/EOS."""
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    device = next(net.parameters()).device
    src = torch.tensor([source_ids], device=device)
    tgt = torch.tensor([[bos] + target_ids], device=device)
    layers = net.cross_attention_weights(src, tgt)
    if not layers:
        return None
    weights = layers[-1][0].mean(dim=0)  # (T, S)
    # Row t is the attention while predicting target token t (decoder input t is the token before it).
    return heatmap_figure(
        weights,
        row_labels=token_labels(tokenizer, target_ids + [eos]),
        column_labels=token_labels(tokenizer, source_ids),
        title=title,
        xlabel="source",
        ylabel="target",
        cmap="Greys",
        vmin=0.0,
    )


class TranslationTask(ZooTask):
    """Drives any model of zoo/models/seq2seq.py's interface; `architecture` names the one built from `net`."""

    family = "translation"
    attention_placements = (
        AttentionPlacement(
            "the encoder's self-attention", "model.net.encoder_attention={{{option}:{value}}}", False, False
        ),
        AttentionPlacement("encoder and decoder self-attention", "attention.{option}={value}", causal=True, grid=False),
    )
    architecture: tuple[type[torch.nn.Module], type] = (TranslationTransformer, TranslationConfig)

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        label_smoothing: float = 0.1,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        val_beam_size: int = 1,
        num_samples: int = 3,
        alignment_plots: bool = True,
        compile: bool = False,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(optimizer, scheduler, compile, lora)
        self.save_hyperparameters()
        network, config = self.architecture
        self.net = self.with_lora(network(config.from_dict(net)))
        self.tokenizer: Tokenizer | None = None
        self._outputs: dict[str, list[tuple[str, str]]] = {}
        self._first_batch: dict[str, dict[str, Any]] = {}

    # -- tokenizer: from the data module, saved with (and restored from) the checkpoint -----------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if self.tokenizer is None and datamodule is not None:
            self.tokenizer = datamodule.tokenizer
        if self.tokenizer is not None:
            self._check_tokenizer(self.tokenizer)

    def _check_tokenizer(self, tokenizer: Tokenizer) -> None:
        cfg = self.net.config
        if tokenizer.get_vocab_size() > cfg.vocab_size:
            raise DataError(
                f"the tokenizer has {tokenizer.get_vocab_size()} tokens but model.net.vocab_size={cfg.vocab_size}"
            )
        ids = (tokenizer.token_to_id(PAD), tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS))
        if ids != (cfg.pad_id, cfg.bos_id, cfg.eos_id):
            raise DataError(
                f"tokenizer ids of {PAD}/{BOS}/{EOS} are {ids}, the model expects "
                f"{(cfg.pad_id, cfg.bos_id, cfg.eos_id)}"
            )

    # -- training -------------------------------------------------------------------------------
    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.network()(src, tgt)

    def _loss(self, batch: dict[str, Any], stage: str) -> torch.Tensor:
        src, tgt = batch["src"], batch["tgt"]
        logits = self(src, tgt[:, :-1])
        labels = tgt[:, 1:]
        loss, nll = label_smoothed_cross_entropy(logits, labels, self.hparams.label_smoothing, self.net.config.pad_id)
        tokens = int((labels != self.net.config.pad_id).sum())
        on_step = stage == "train"
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, batch_size=tokens)
        self.log(f"{stage}/nll", nll, on_step=False, on_epoch=True, batch_size=tokens)
        return loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self._loss(batch, "train")

    def throughput_counts(self, batch: dict[str, Any]) -> dict[str, int]:
        """Sentence pairs, and the tokens the network reads (source and decoder input, padding included)."""
        src, tgt = batch["src"], batch["tgt"]
        return {"samples": src.shape[0], "tokens": src.numel() + tgt[:, :-1].numel()}

    # -- evaluation -----------------------------------------------------------------------------
    def translate_ids(self, src: torch.Tensor, beam_size: int) -> list[list[int]]:
        options = dict(max_len_a=self.hparams.max_len_a, max_len_b=self.hparams.max_len_b)
        if beam_size == 1:
            return greedy_decode(self.net, src, **options)
        return beam_search(self.net, src, beam_size, self.hparams.length_penalty, **options)

    def _evaluate(self, batch: dict[str, Any], stage: str, beams: dict[str, int]) -> None:
        self._loss(batch, stage)
        if stage not in self._first_batch:
            self._first_batch[stage] = batch
        for name, beam_size in beams.items():
            hypotheses = [decode_ids(self.tokenizer, ids) for ids in self.translate_ids(batch["src"], beam_size)]
            self._outputs.setdefault(name, []).extend(zip(hypotheses, batch["tgt_text"]))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val", {"val/bleu": self.hparams.val_beam_size})

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test", {"test/bleu": self.hparams.beam_size, "test/bleu_greedy": 1})

    def on_validation_epoch_end(self) -> None:
        self._end_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._end_evaluation("test")

    def _end_evaluation(self, stage: str) -> None:
        outputs, self._outputs = self._outputs, {}
        for name, pairs in outputs.items():
            hypotheses, references = zip(*pairs)
            self.log(name, corpus_bleu(list(hypotheses), list(references)), prog_bar=True)
        batch = self._first_batch.pop(stage, None)
        if batch is not None and not self.trainer.sanity_checking:
            self._log_samples(batch, stage)

    def _log_samples(self, batch: dict[str, Any], stage: str) -> None:
        """A few translations as a table (source | reference | hypothesis), and the alignment of the first
        as a heatmap (alignments/<stage>_epoch<n>.png in the run directory, and the loggers)."""
        count = min(self.hparams.num_samples, len(batch["src_text"]))
        if count == 0:
            return
        src = batch["src"][:count]
        translations = self.translate_ids(src, self.hparams.beam_size if stage == "test" else 1)
        rows = [
            [batch["src_text"][i], batch["tgt_text"][i], decode_ids(self.tokenizer, translations[i])]
            for i in range(count)
        ]
        text = "\n\n".join(
            f"src: {source}\nref: {reference}\nhyp: {hypothesis}" for source, reference, hypothesis in rows
        )
        log.info("%s samples (epoch %d):\n%s", stage, self.current_epoch, text)
        log_text_table(self, f"{stage}/samples", ["source", "reference", "hypothesis"], rows)
        if not self.hparams.alignment_plots:
            return
        source_ids = [i for i in src[0].tolist() if i != self.net.config.pad_id]
        figure = alignment_figure(
            self.net, self.tokenizer, source_ids, translations[0], f"{stage} epoch {self.current_epoch}"
        )
        if figure is None:
            return
        path = Path(self.trainer.default_root_dir) / "alignments" / f"{stage}_epoch{self.current_epoch:03d}.png"
        log_image(self, f"{stage}/alignment", figure, save_path=path)


class RNNTranslationTask(TranslationTask):
    """The same task (loss, label smoothing, BLEU, greedy and beam search) for the RNN encoder-decoder."""

    family = "rnn_translation"
    takes_lora = False  # recurrent cells and an attention over the encoder states, no Transformer blocks
    attention_placements = (
        AttentionPlacement(  # a cross-attention of the variants the RNN has: no positions across two sequences
            "the decoder's attention over the encoder states",
            "attention.{option}={value}",
            causal=False,
            grid=False,
            variants=ATTENTIONS,
            positions=False,
        ),
    )
    architecture = (RNNTranslation, RNNTranslationConfig)
