"""Causal language modelling with a GPT: next-token cross-entropy, perplexity, tokens/s, samples.

The vocabulary comes from the data's tokenizer, so the network is built in `setup` once the corpus is
tokenised (or in __init__ when the hyper-parameters already hold vocab_size, as a checkpoint's do). The
tokenizer travels inside every checkpoint, and `zoo.load` rebuilds model and tokenizer from a checkpoint
alone (what `python run.py model=gpt mode=generate ckpt_path=...` uses).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.utilities import rank_zero_only
from tokenizers import Tokenizer

from zoo.data.tokenizers import encode_text, tokenizer_from_string, tokenizer_kind, tokenizer_to_string
from zoo.errors import AttentionPlacement, CheckpointError
from zoo.models.gpt import GPT, GPTConfig, SamplingConfig
from zoo.tasks.base import ZooTask
from zoo.training.loggers import log_text_table

# The text logged at each validation: a prompt, a seed of its own, and how to sample (SamplingConfig).
SAMPLE_DEFAULTS = {"prompt": "\n", "seed": 0, **asdict(SamplingConfig())}
# Under trainer.fast_dev_run (debug=fdr: one batch of each loop, to see that a setting is wired) the sample stops
# after this many tokens: they run every piece of generation (prompt, cache, sampling), and the 200 of the default
# were the larger part of a small model's debug run (more so with LSH or routing attention, whose every new token
# re-clusters the whole prefix). Figures: experiments/results/test_suite_time.md, "Debug runs, a forked loader".
FAST_DEV_RUN_SAMPLE_TOKENS = 16


class LanguageModelTask(ZooTask):
    """net: GPTConfig fields (vocab_size null = the tokenizer's); sample: the text generated at each
    validation {prompt, seed, max_new_tokens, temperature, top_k, top_p} (max_new_tokens 0: none).

    pretrained: a Hugging Face folder (Llama, Qwen2, Mistral, GPT-2: config.json + safetensors, GPT.from_huggingface)
    to start from: its config replaces net's architecture and its tokenizer.json the data's tokenizer. Of net's
    attention only what a user changes on purpose applies: a variant other than full (with its options), a
    rope_scaling; the checkpoint's own (RoPE base, grouped heads, Mistral's window) stays otherwise.

    lora: zoo.nn.lora.LoRAConfig fields (rank 0: off), as every task takes them (zoo.tasks.base.ZooTask). With a
    pretrained base, checkpoints hold the adapters only and name the base folder (hparams `pretrained`).
    """

    family = "gpt"
    attention_placements = (
        AttentionPlacement("every self-attention", "attention.{option}={value}", causal=True, grid=False),
    )

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        sample: dict[str, Any] | None = None,
        compile: bool = False,
        pretrained: str | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(optimizer, scheduler, compile, lora)
        self.save_hyperparameters()
        unknown = set(sample or {}) - set(SAMPLE_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown model.sample options {sorted(unknown)}; valid: {sorted(SAMPLE_DEFAULTS)}")
        self.sample_config = {**SAMPLE_DEFAULTS, **(sample or {})}
        self.sampling = SamplingConfig(**{k: self.sample_config[k] for k in asdict(SamplingConfig())})
        self.net: GPT | None = None
        self.tokenizer: Tokenizer | None = None
        self.pretrained_without_tokenizer: str | None = None  # the folder, named if the data's tokenizer cannot fit
        if pretrained:
            net_config = GPTConfig.from_dict(net) if net.get("vocab_size") is not None else None
            changes = net_config.attention.to_dict() if net_config else attention_changes(net.get("attention"))
            self.net = self.with_lora(GPT.from_huggingface(pretrained, attention=changes))
            self.net.train()
            tokenizer_file = Path(pretrained).expanduser() / "tokenizer.json"
            if tokenizer_file.is_file():
                self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
            else:
                self.pretrained_without_tokenizer = str(pretrained)
            # Checkpoints then describe the imported architecture themselves; without LoRA they hold every weight
            # and reload without the folder, with LoRA they hold the adapters and name the folder as their base.
            self.hparams["net"], self.hparams["pretrained"] = self.net.config.to_dict(), self.lora_base(pretrained)
        elif net.get("vocab_size") is not None:
            self.net = self.with_lora(GPT(GPTConfig.from_dict(net)))
        self.val_loss, self.test_loss = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()

    # -- model and tokenizer from the data ------------------------------------------------------------
    def setup(self, stage: str) -> None:
        self.take_data(getattr(self.trainer, "datamodule", None) if self._trainer is not None else None)

    def take_data(self, datamodule: Any) -> None:
        """The data's tokenizer, and the network built with its vocabulary (unless a checkpoint's hparams or a
        pretrained model built it already); the run's pipeline calls this before fit, Lightning's setup again."""
        if self.tokenizer is not None and hasattr(datamodule, "use_tokenizer"):  # pretrained: speak its language
            datamodule.use_tokenizer(self.tokenizer)
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None:
            return
        self._adopt_tokenizer(tokenizer, source="data")
        vocab_size = tokenizer.get_vocab_size()
        if self.net is None:
            self.hparams.net = {**self.hparams.net, "vocab_size": vocab_size}
            self.net = self.with_lora(GPT(GPTConfig.from_dict(self.hparams.net)))
        elif self.net.config.vocab_size < vocab_size and self.pretrained_without_tokenizer:
            folder = self.pretrained_without_tokenizer
            raise CheckpointError(
                f"model.pretrained={folder!r} has no tokenizer.json, so the data made its own {describe(tokenizer)} "
                f"tokenizer, whose ids the checkpoint (vocabulary {self.net.config.vocab_size}) was not trained on; "
                f"put the checkpoint's tokenizer.json in {folder} (transformers: "
                "AutoTokenizer.from_pretrained(<name>).save_pretrained(<folder>))"
            )
        elif self.net.config.vocab_size < vocab_size:
            raise ValueError(
                f"model.net.vocab_size={self.net.config.vocab_size} is smaller than the tokenizer's vocabulary "
                f"({vocab_size}); set it to null (taken from the tokenizer) or at least {vocab_size}"
            )
        block_size = getattr(datamodule, "block_size", None)
        limit = self.net.max_length  # None: the attention extrapolates (ALiBi, T5, scaled RoPE)
        if block_size is not None and limit is not None and block_size > limit:
            raise ValueError(
                f"data.block_size={block_size} exceeds the model's block_size={self.net.config.block_size}; "
                f"use data.block_size <= {self.net.config.block_size}"
            )

    def _adopt_tokenizer(self, tokenizer: Tokenizer, source: str) -> None:
        """Take `tokenizer` (from `source`: "data" or "checkpoint"), unless the model already has a different
        one from the other side: a checkpoint/data mismatch."""
        self._refuse_other_tokenizer(tokenizer, source)
        self.tokenizer = tokenizer

    def _refuse_other_tokenizer(self, tokenizer: Tokenizer, source: str) -> None:
        if self.tokenizer is not None and tokenizer_to_string(tokenizer) != tokenizer_to_string(self.tokenizer):
            trained, data = (tokenizer, self.tokenizer) if source == "checkpoint" else (self.tokenizer, tokenizer)
            raise ValueError(
                f"tokenizer mismatch: the checkpoint was trained with a {describe(trained)} tokenizer, the data has "
                f"a {describe(data)} one; use the data and data.tokenizer of the training run"
            )

    def restore_tokenizer(self, tokenizer: Tokenizer) -> None:
        self._adopt_tokenizer(tokenizer, source="checkpoint")

    def check_checkpoint(self, checkpoint: dict[str, Any], path: str) -> None:
        """A checkpoint of another tokenizer is named as such before its embedding's shape would be."""
        if "tokenizer" in checkpoint:
            self._refuse_other_tokenizer(tokenizer_from_string(checkpoint["tokenizer"]), source="checkpoint")
        super().check_checkpoint(checkpoint, path)

    # -- training and evaluation ----------------------------------------------------------------------
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.network()(idx)

    def _loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        # (B, T) inputs and next-token targets, and with packing (data.packing) the document ids: targets that
        # cross a document's end are -100, cross_entropy's ignore_index.
        x, y, *documents = batch
        logits = self.network()(x, document_ids=documents[0]) if documents else self.network()(x)  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> dict[str, Any]:
        if self.trainer.max_steps is None or self.trainer.max_steps <= 0:
            raise ValueError(
                f"trainer.max_steps must be a positive int for language models (training draws random blocks, "
                f"so there are no epochs), got {self.trainer.max_steps}"
            )
        return super().configure_optimizers()

    def throughput_counts(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, int]:
        """Samples and tokens of a training batch (zoo.training.throughput)."""
        return {"samples": batch[0].shape[0], "tokens": batch[0].numel()}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        if self.logging_this_step():
            self.log("train/loss", loss, on_step=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=(batch[1] >= 0).sum())

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=(batch[1] >= 0).sum())

    def _log_loss_and_perplexity(self, stage: str, metric: torchmetrics.MeanMetric) -> None:
        loss = metric.compute()
        metric.reset()
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True)  # the same on every rank (compute() gathered)
        self.log(f"{stage}/ppl", torch.exp(loss), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_loss_and_perplexity("val", self.val_loss)
        if not self.trainer.sanity_checking and self.sampling.max_new_tokens > 0:
            self.log_sample()

    def on_test_epoch_end(self) -> None:
        self._log_loss_and_perplexity("test", self.test_loss)

    # -- samples --------------------------------------------------------------------------------------
    @rank_zero_only
    def log_sample(self) -> None:
        """Generate from model.sample.prompt and show it in the console, the loggers and samples.txt."""
        if self.tokenizer is None:
            return
        prompt = self.sample_config["prompt"]
        generator = torch.Generator(device=self.device).manual_seed(
            self.sample_config["seed"]
        )  # training RNG untouched
        sampling = self.sampling
        if self.trainer.fast_dev_run:
            sampling = replace(sampling, max_new_tokens=min(sampling.max_new_tokens, FAST_DEV_RUN_SAMPLE_TOKENS))
        text = generate_text(self.net, self.tokenizer, prompt, sampling, generator=generator)
        step = self.global_step
        print(f"\n--- sample at step {step} ---\n{text}\n---", flush=True)
        log_text_table(self, "val/samples", ["step", "prompt", "sample"], [[step, prompt, text]])
        root = Path(self.trainer.default_root_dir)
        if root.is_dir():
            with open(root / "samples.txt", "a", encoding="utf-8") as handle:
                handle.write(f"--- step {step} ---\n{text}\n")


def attention_changes(attention: Any) -> dict[str, Any]:
    """The attention settings a user asked for on purpose over a pretrained checkpoint's: a variant other than
    full (with its options), a RoPE scaling (with its factor and parameters)."""
    attention = dict(attention or {})
    changes: dict[str, Any] = {}
    if attention.get("variant", "full") != "full":
        shared = {"rope", "rope_base", "rope_scaling", "rope_factor", "rope_parameters", "position_bias",
                  "num_buckets", "max_distance", "share_bias", "kv_heads", "dropout"}  # fmt: skip
        changes.update({key: value for key, value in attention.items() if key not in shared})
    if attention.get("rope_scaling"):
        changes.update({key: attention.get(key) for key in ("rope_scaling", "rope_factor", "rope_parameters")})
    return changes


def describe(tokenizer: Tokenizer) -> str:
    return f"{tokenizer_kind(tokenizer)} ({tokenizer.get_vocab_size()} tokens)"


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """The prompt and its continuation, as text."""
    sampling = sampling or SamplingConfig()
    if not prompt:
        raise ValueError('prompt is empty; give at least one character, e.g. prompt="\\n"')
    ids = encode_text(tokenizer, prompt)
    limit = model.max_length
    if limit is not None and len(ids) > limit:
        raise ValueError(
            f"prompt is {len(ids)} tokens long, more than the model's block_size={limit}; "
            f"use a prompt of at most {limit} tokens"
        )
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    out = model.generate(
        idx, sampling.max_new_tokens, sampling.temperature, sampling.top_k, sampling.top_p, generator=generator
    )
    return tokenizer.decode(out[0].tolist())
