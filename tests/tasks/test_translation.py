"""The translation task: label-smoothed loss, BLEU of its own searches, checkpoints, mode=translate."""

from __future__ import annotations

import json
import random
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

import zoo
from tests.helpers import run_in_process
from zoo.data.parallel_text import ParallelTextDataModule, decode_ids, encode_sources, pad_sequences
from zoo.models.seq2seq import beam_search, greedy_decode
from zoo.tasks.translation import TranslationTask, corpus_bleu, label_smoothed_cross_entropy

NET = dict(
    vocab_size=300, dim=64, encoder_layers=2, decoder_layers=2, num_heads=4, mlp_dim=128, dropout=0.0, max_length=32
)


def test_label_smoothed_loss_matches_the_formula_and_ignores_padding() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    targets[1, 3:] = 0  # padding
    loss, nll = label_smoothed_cross_entropy(logits, targets, smoothing=0.1, pad_id=0)
    logprobs = F.log_softmax(logits, dim=-1)[targets != 0]
    real = targets[targets != 0]
    smoothed = torch.full_like(logprobs, 0.1 / 11).scatter_add_(1, real[:, None], torch.full((len(real), 1), 0.9))
    torch.testing.assert_close(loss, -(smoothed * logprobs).sum(-1).mean())
    torch.testing.assert_close(nll, -logprobs.gather(1, real[:, None]).mean())


def test_bleu_is_sacrebleu_on_detokenized_text() -> None:
    references = ["A man rides a bike.", "Two dogs play in the snow."]
    assert corpus_bleu(references, references) == pytest.approx(100.0)
    assert corpus_bleu(["A man rides a horse.", "Two cats sleep."], references) < 50.0


def reverse_task_files(folder: Path, seed: int = 0) -> dict[str, str]:
    """Sequences of letters and their reversal, one TSV per split: a toy task with an exact answer."""
    rng = random.Random(seed)
    letters = "abcdefgh"
    files = {}
    for split, size in (("train", 3000), ("val", 60), ("test", 60)):
        lines = []
        for _ in range(size):
            words = [rng.choice(letters) for _ in range(rng.randint(3, 7))]
            lines.append(f"{' '.join(words)}\t{' '.join(reversed(words))}")
        path = folder / f"{split}.tsv"
        path.write_text("\n".join(lines) + "\n")
        files[split] = str(path)
    return files


EPOCHS = 2


def test_fit_and_test_report_bleu_of_its_beam_and_greedy_search_and_the_checkpoint_translates_the_same(
    tmp_path: Path,
) -> None:
    """What the task computes, not what a short training happens to learn (that differs between hosts): the
    test BLEU is corpus BLEU of the model's own beam-search translations of the test split, greedy's of greedy
    search; the checkpoint carries the tokenizer and beam size, and translates as the trained network does."""
    L.seed_everything(0, verbose=False)
    data = ParallelTextDataModule(**reverse_task_files(tmp_path), vocab_size=300, max_tokens=256, max_length=32)
    task = TranslationTask(
        NET,
        optimizer={"name": "adam", "lr": 2e-3, "betas": [0.9, 0.98]},
        scheduler={"name": "inverse_sqrt", "warmup_steps": 50},
        beam_size=3,
        num_samples=2,
    )
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        limit_train_batches=10,
        check_val_every_n_epoch=EPOCHS,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
    )
    trainer.fit(task, datamodule=data)
    metrics = trainer.test(task, datamodule=data, verbose=False)[0]
    assert (tmp_path / "alignments" / f"test_epoch{EPOCHS:03d}.png").stat().st_size > 0
    # by the definition: corpus BLEU of the network's own searches over the whole test split
    net, tokenizer, options = task.net.eval(), data.tokenizer, {"max_len_a": 1.2, "max_len_b": 10}
    beam, greedy, references = [], [], []
    with torch.no_grad():
        for batch in data.test_dataloader():
            beam += [decode_ids(tokenizer, ids) for ids in beam_search(net, batch["src"], 3, 1.0, **options)]
            greedy += [decode_ids(tokenizer, ids) for ids in greedy_decode(net, batch["src"], **options)]
            references += batch["tgt_text"]
    test_split = (tmp_path / "test.tsv").read_text().splitlines()
    assert sorted(references) == sorted(line.split("\t")[1] for line in test_split)
    assert metrics["test/bleu"] == pytest.approx(corpus_bleu(beam, references), abs=1e-4)
    assert metrics["test/bleu_greedy"] == pytest.approx(corpus_bleu(greedy, references), abs=1e-4)
    # The checkpoint carries the tokenizer: a fresh model translates with it (weights_only load), as the network.
    loaded = zoo.load(tmp_path / "ckpt" / "last.ckpt")
    assert loaded.settings["beam_size"] == 3 and loaded.tokenizer.to_str() == tokenizer.to_str()
    src = pad_sequences(encode_sources(tokenizer, ["a b c d", "h g f e d"]), 0)
    with torch.no_grad():
        assert beam_search(loaded, src, 3, 1.0, **options) == beam_search(net, src, 3, 1.0, **options)


def test_cli_trains_on_numbers_then_translates_with_the_checkpoint(tmp_outputs: Path, capsys) -> None:
    small = [
        "model=translation",
        "data.num_train=600",
        "data.num_val=20",
        "data.num_test=20",
        # a small network: the test checks the run's outputs and the translate mode, not what it learns
        "model.net.dim=32",
        "model.net.num_heads=2",
        "model.net.mlp_dim=64",
        "model.net.encoder_layers=1",
        "model.net.decoder_layers=1",
        "model.beam_size=2",
        "trainer.max_epochs=1",
        "logger=csv",
        f"paths.log_dir={tmp_outputs}",
        "hydra.run.dir=" + str(tmp_outputs / "train"),
    ]
    code, _, err = run_in_process(small, capsys)
    assert code == 0, err[-3000:]
    metrics = json.loads((tmp_outputs / "train" / "metrics.json").read_text())
    assert 0.0 <= metrics["test/bleu"] <= 100.0 and "test/bleu_greedy" in metrics and "val/bleu" in metrics
    assert list((tmp_outputs / "train" / "alignments").glob("*.png"))
    ckpt = tmp_outputs / "train" / "checkpoints" / "last.ckpt"
    translate = [
        "model=translation",
        "mode=translate",
        f"ckpt_path={ckpt}",
        "text=dreihundertvierundzwanzig",
        "hydra.run.dir=" + str(tmp_outputs / "translate"),
    ]
    code, out, err = run_in_process(translate, capsys)
    assert code == 0, err[-3000:]
    assert "dreihundertvierundzwanzig\n  -> " in out
    assert (tmp_outputs / "translate" / "alignment.png").stat().st_size > 0
    code, _, err = run_in_process(
        [
            "model=translation",
            "mode=translate",
            "ckpt_path=nowhere.ckpt",
            "text=eins",
            "hydra.run.dir=" + str(tmp_outputs / "missing"),
        ],
        capsys,
    )
    assert code != 0 and "nowhere.ckpt" in err
    assert len(err.strip().splitlines()) == 1


def test_alignment_axis_labels_are_readable_bpe_pieces(tmp_path: Path) -> None:
    from zoo.data.parallel_text import NumbersDataModule
    from zoo.tasks.translation import token_labels

    module = NumbersDataModule(num_train=500, num_val=5, num_test=5, max_digits=3, vocab_size=300)
    module.setup()
    labels = token_labels(module.tokenizer, module.tokenizer.encode("fünf").ids + [2])
    assert "".join(labels) == "▁fünf<eos>"  # bytes of 'ü' decoded, not shown as 'Ã¼'
