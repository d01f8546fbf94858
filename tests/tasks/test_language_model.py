"""Language-model task: builds the GPT from the data's tokenizer, trains, checkpoints with its tokenizer,
and `mode=generate` rebuilds everything from the checkpoint alone."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch

import zoo
from tests.helpers import run_in_process
from zoo.data.text import TextDataModule
from zoo.data.tokenizers import train_char_tokenizer
from zoo.errors import CheckpointError
from zoo.models.gpt import GPT, GPTConfig, SamplingConfig
from zoo.tasks.language_model import FAST_DEV_RUN_SAMPLE_TOKENS, LanguageModelTask, generate_text
from zoo.tasks.optim import param_groups
from zoo.training.throughput import Throughput

TEXT = "".join(
    f"ROMEO: {'what light through yonder window breaks' if i % 2 else 'it is the east'}.\n" for i in range(400)
)
NET = {"vocab_size": None, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "play.txt"
    path.write_text(TEXT)
    return path


def fit(
    corpus: Path, root: Path, max_steps: int = 60, **task_options
) -> tuple[LanguageModelTask, L.Trainer, TextDataModule]:
    torch.manual_seed(0)
    data = TextDataModule(path=str(corpus), block_size=32, batch_size=8, eval_batches=2, eval_batch_size=8)
    options = {
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "scheduler": {"warmup_steps": 5, "min_lr": 3e-4},
        "sample": {"prompt": "ROMEO:", "max_new_tokens": 20},
    }
    task = LanguageModelTask(net=dict(NET), **options)
    trainer = L.Trainer(
        max_steps=max_steps, val_check_interval=max_steps // 2, check_val_every_n_epoch=None, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), gradient_clip_val=1.0,
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=str(root / "checkpoints"), monitor="val/loss"),
                   Throughput(peak_flops=1e12)],
    )  # fmt: skip
    trainer.fit(task, datamodule=data)
    return task, trainer, data


def test_validation_reports_the_token_mean_cross_entropy_and_the_checkpoint_restores_model_and_tokenizer(
    corpus: Path, tmp_path: Path
) -> None:
    """What the task computes, not what 60 steps happen to learn: val/loss is the cross-entropy of the next token
    averaged over every target token of the val batches (by hand below), val/ppl its exponential."""
    task, trainer, data = fit(corpus, tmp_path)
    assert task.net.config.vocab_size == data.vocab_size == task.hparams.net["vocab_size"]
    assert trainer.callback_metrics["train/tokens_per_s"] > 0
    metrics = trainer.validate(task, datamodule=data, verbose=False)[0]
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.val_dataloader():
            logits = task.net.eval()(x)
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
    assert metrics["val/loss"] == pytest.approx(total / count, rel=1e-5)
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss"]), rel=1e-5)
    assert "--- step 60 ---\nROMEO:" in (tmp_path / "samples.txt").read_text()

    model = zoo.load(trainer.checkpoint_callback.best_model_path)
    tokenizer = model.tokenizer
    assert tokenizer.to_str() == data.tokenizer.to_str()
    x, _ = next(iter(data.val_dataloader()))
    with torch.no_grad():
        assert torch.allclose(model(x), task.net.eval()(x), atol=1e-6)
    text = generate_text(model, tokenizer, "ROMEO:", SamplingConfig(max_new_tokens=40, temperature=0.0))
    assert text.startswith("ROMEO:") and len(text) == 46

    with pytest.raises(ValueError, match=r"characters \['Z', '\$'\]|characters \['\$', 'Z'\]"):
        generate_text(model, tokenizer, "Z$", SamplingConfig(max_new_tokens=5))
    with pytest.raises(ValueError, match="prompt is 33 tokens long.*block_size=32"):
        generate_text(model, tokenizer, "R" * 33, SamplingConfig(max_new_tokens=5))

    # The same checkpoint against data with another tokenizer: a clear mismatch error.
    other = corpus.parent / "other.txt"
    other.write_text(TEXT + "Juliet!\n")
    other_data = TextDataModule(path=str(other), block_size=32, batch_size=8, eval_batches=1)
    tester = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    fresh = LanguageModelTask(net=dict(NET))
    with pytest.raises(ValueError, match="tokenizer mismatch: the checkpoint was trained with a char"):
        tester.test(fresh, datamodule=other_data, ckpt_path=trainer.checkpoint_callback.best_model_path)


def test_weight_decay_skips_biases_norms_and_embeddings(corpus: Path) -> None:
    task = LanguageModelTask(net={**NET, "vocab_size": 40})
    decay, no_decay = param_groups(task.net, weight_decay=0.1)
    decayed = {id(p) for p in decay["params"]}
    for name, param in task.net.named_parameters():
        is_matrix = name.endswith("weight") and param.ndim == 2 and not name.startswith(("wte", "wpe"))
        assert (id(param) in decayed) == is_matrix, name
    assert no_decay["weight_decay"] == 0.0


@pytest.mark.parametrize("fast_dev_run", [True, False])
def test_the_validation_sample_is_cut_short_only_under_fast_dev_run(
    corpus: Path, tmp_path: Path, fast_dev_run: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = []

    def recording(model, tokenizer, prompt, sampling, generator=None):
        asked.append(sampling.max_new_tokens)
        return generate_text(model, tokenizer, prompt, sampling, generator)

    monkeypatch.setattr("zoo.tasks.language_model.generate_text", recording)
    data = TextDataModule(path=str(corpus), block_size=32, batch_size=8, eval_batches=1, eval_batch_size=8)
    task = LanguageModelTask(net=dict(NET), sample={"prompt": "ROMEO:", "max_new_tokens": 40})
    limits = {"fast_dev_run": True} if fast_dev_run else {"max_steps": 1, "val_check_interval": 1}
    trainer = L.Trainer(**limits, limit_val_batches=1, check_val_every_n_epoch=None, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(task, datamodule=data)
    assert asked == [FAST_DEV_RUN_SAMPLE_TOKENS if fast_dev_run else 40]
    assert (tmp_path / "samples.txt").read_text().startswith("--- step 1 ---\nROMEO:")


def test_max_steps_is_required(corpus: Path, tmp_path: Path) -> None:
    data = TextDataModule(path=str(corpus), block_size=32, batch_size=8, eval_batches=1)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    with pytest.raises(ValueError, match="trainer.max_steps must be a positive int"):
        trainer.fit(LanguageModelTask(net=dict(NET)), datamodule=data)


def test_generate_text_takes_prompts_past_block_size_when_positions_extrapolate() -> None:
    tokenizer = train_char_tokenizer([TEXT])
    prompt = "ROMEO: what light through"  # 25 characters, block_size 16
    torch.manual_seed(0)
    alibi = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2, n_embd=16,
                          attention={"position_bias": "alibi"}))  # fmt: skip
    text = generate_text(alibi, tokenizer, prompt, SamplingConfig(max_new_tokens=20, temperature=0.0))
    assert text.startswith(prompt) and len(text) == 45
    learned = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2, n_embd=16))
    with pytest.raises(ValueError, match="prompt is 25 tokens long.*block_size=16"):
        generate_text(learned, tokenizer, prompt, SamplingConfig(max_new_tokens=5))


def test_zoo_load_rejects_other_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing.ckpt' does not exist; valid: a checkpoint"):
        zoo.load(tmp_path / "missing.ckpt")
    (tmp_path / "garbage.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="garbage.ckpt.* is truncated or corrupt"):
        zoo.load(tmp_path / "garbage.ckpt")
    torch.save({"state_dict": {}, "hyper_parameters": {"net": {"image_size": 8}}}, tmp_path / "vit.ckpt")
    with pytest.raises(CheckpointError, match="not a checkpoint of a zoo model"):
        zoo.load(tmp_path / "vit.ckpt")


def test_cli_trains_then_generates_from_the_checkpoint(corpus: Path, tmp_outputs: Path, capsys) -> None:
    common = ["model=gpt", "data=text", f"data.path={corpus}", f"paths.log_dir={tmp_outputs}", "print_config=false"]
    code, out, err = run_in_process(
        common + ["data.block_size=32", "model.net.n_layer=1", "model.net.n_embd=32", "trainer.max_steps=20",
                  "trainer.val_check_interval=10", "data.eval_batches=2", "model.sample.max_new_tokens=10"], capsys
    )  # fmt: skip
    assert code == 0, err[-3000:]
    (run,) = (tmp_outputs / "gpt").iterdir()
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file() and "test/ppl" in out
    code, out, err = run_in_process(
        common + ["mode=generate", f"ckpt_path={checkpoint}", "prompt=ROMEO:", "max_new_tokens=30"], capsys
    )
    assert code == 0, err[-3000:]
    assert "ROMEO:" in out
    code, out, err = run_in_process(common + ["mode=generate", f"ckpt_path={checkpoint}", "prompt=Zebra"], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: characters ['Z'] are not in")


def test_a_pretrained_folder_without_tokenizer_json_names_the_missing_file(tmp_path: Path) -> None:
    """The data then makes its own tokenizer; one larger than the checkpoint's vocabulary used to get the advice
    "set model.net.vocab_size to null", which fails the same way (the folder's config sets the vocabulary)."""
    from types import SimpleNamespace

    from tests.models.test_huggingface_decoders import tiny_checkpoint

    tiny_checkpoint(tmp_path / "pretrained", "llama")  # vocabulary 61, no tokenizer.json
    task = LanguageModelTask(net=dict(NET), pretrained=str(tmp_path / "pretrained"))
    tokenizer = train_char_tokenizer(["".join(chr(0x100 + i) for i in range(100))])
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tokenizer, block_size=16))
    with pytest.raises(CheckpointError) as error:
        task.setup("fit")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"model.pretrained={str(tmp_path / 'pretrained')!r} has no tokenizer.json, so the data")
    assert f"put the checkpoint's tokenizer.json in {tmp_path / 'pretrained'}" in message
