"""CLIP task: prompt-ensembled zero-shot classifier, retrieval metrics on hand-made examples, a short fit and
test on digit captions (metrics, similarity picture, tokenizer kept in the checkpoint), pretrained import,
and the command line end to end."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, processors
from torchvision.io import write_png

from tests.helpers import run_in_process
from zoo.data.captions import (
    CaptionFileDataModule,
    LabelledCaptionDataModule,
    encode_captions,
    fill_templates,
    train_caption_tokenizer,
)
from zoo.data.images import DigitsDataModule
from zoo.data.tokenizers import BOS, EOS, PAD, UNK, train_tokenizer
from zoo.tasks.clip import CLIPTask
from zoo.tasks.clip_evaluation import retrieval_metrics, similarity_figure, zero_shot_classifier

NET = {
    "embed_dim": 16,
    "image": {"image_size": 8, "patch_size": 2, "in_channels": 1, "dim": 32, "depth": 1, "num_heads": 2},
    "text": {"vocab_size": 320, "max_length": 32, "dim": 32, "depth": 1, "num_heads": 2},
    "attention": {"variant": "full"},
}
TEMPLATES = ["a photo of the number {label}.", "the digit {label}."]


def digits_captions(tokenizer: str = "bpe") -> LabelledCaptionDataModule:
    images = DigitsDataModule(image_size=8, in_channels=1, augment=False)
    return LabelledCaptionDataModule(images, TEMPLATES, batch_size=64, eval_batch_size=128, tokenizer=tokenizer,
                                     vocab_size=320, max_length=32)  # fmt: skip


def test_zero_shot_classifier_is_the_renormalised_mean_of_template_embeddings() -> None:
    task = CLIPTask(NET)
    tokenizer = train_caption_tokenizer([c for row in fill_templates(TEMPLATES, "0123") for c in row], max_length=16)
    tokens = [encode_captions(tokenizer, row) for row in fill_templates(TEMPLATES, "0123")]
    classes = zero_shot_classifier(task.net, tokens)
    with torch.no_grad():
        mean = (task.net.encode_text(tokens[0]) + task.net.encode_text(tokens[1])) / 2
    assert classes.shape == (4, 16)
    torch.testing.assert_close(classes, F.normalize(mean, dim=-1))


def test_retrieval_metrics_count_ranks_of_the_best_correct_answer() -> None:
    texts = torch.eye(3)
    images = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8], [0.6, 0.8, 0.0]])
    ids = torch.arange(3)
    # image->text ranks 0, 1, 2; text->image ranks 0, 1, 1 (ties never count against the query).
    for chunk_size in (1, 1024):
        metrics = retrieval_metrics(images, texts, ids, ids, ks=(1, 2), chunk_size=chunk_size)
        assert metrics["image_to_text_R@1"] == pytest.approx(1 / 3)
        assert metrics["image_to_text_R@2"] == pytest.approx(2 / 3)
        assert metrics["image_to_text_median_rank"] == 2.0
        assert metrics["text_to_image_R@1"] == pytest.approx(1 / 3)
        assert metrics["text_to_image_R@2"] == pytest.approx(1.0)
    # Texts 1 and 2 both describe images 1 and 2: any of them is a correct answer.
    shared = torch.tensor([0, 1, 1])
    metrics = retrieval_metrics(images, texts, shared, shared, ks=(1,))
    assert metrics["image_to_text_R@1"] == 1.0 and metrics["text_to_image_R@1"] == 1.0


def test_similarity_figure_draws_one_cell_per_pair(tmp_path: Path) -> None:
    figure = similarity_figure(torch.rand(3, 1, 8, 8), ["a", "b", "c"], torch.rand(3, 3))
    axes = figure.axes[0]
    assert len(axes.texts) == 9 and len(axes.images) == 4  # the matrix and three thumbnails
    figure.savefig(tmp_path / "similarity.png")
    assert (tmp_path / "similarity.png").stat().st_size > 1000


def trainer(tmp_path: Path, **overrides) -> L.Trainer:
    options = dict(default_root_dir=str(tmp_path), accelerator="cpu", max_steps=4, limit_val_batches=1,
                   limit_test_batches=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, val_check_interval=2, **overrides)  # fmt: skip
    return L.Trainer(**options)


def test_fit_then_test_reports_zero_shot_retrieval_and_draws_similarity(tmp_path: Path) -> None:
    torch.manual_seed(0)
    task, datamodule = CLIPTask(NET, optimizer={"lr": 1e-3}), digits_captions()
    fit = trainer(tmp_path, callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    fit.fit(task, datamodule=datamodule)
    assert 0.0 <= fit.callback_metrics["val/zero_shot_top1"] <= 1.0
    # The logit scale is clamped as a parameter too, within [0, ln 100].
    assert 0.0 <= task.net.logit_scale.item() <= task.net.config.logit_scale_max
    metrics = fit.test(task, datamodule=datamodule, verbose=False)[0]
    for key in ("test/zero_shot_top1", "test/zero_shot_top5", "test/image_to_text_R@1", "test/text_to_image_R@10",
                "test/image_to_text_median_rank", "test/loss"):  # fmt: skip
        assert key in metrics
    assert metrics["test/zero_shot_top5"] >= metrics["test/zero_shot_top1"]
    assert (tmp_path / "clip_similarity.png").is_file()

    # A checkpoint carries its tokenizer: evaluated with data whose own tokenizer differs (char level), the
    # restored BPE tokenizer takes over and the numbers are the same.
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert '"BPE"' in checkpoint["tokenizer"]
    other_data = digits_captions(tokenizer="char")
    again = trainer(tmp_path).test(CLIPTask(NET), datamodule=other_data, ckpt_path=tmp_path / "last.ckpt",
                                   weights_only=True, verbose=False)[0]  # fmt: skip
    assert '"BPE"' in other_data.tokenizer.to_str()
    assert again["test/zero_shot_top1"] == pytest.approx(metrics["test/zero_shot_top1"])
    assert again["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-5)


def test_data_without_classes_cannot_be_monitored_by_zero_shot_accuracy(tmp_path: Path) -> None:
    for i in range(4):
        write_png(torch.full((3, 8, 8), 40 * i, dtype=torch.uint8), str(tmp_path / f"{i}.png"))
    (tmp_path / "pairs.csv").write_text("image,caption\n" + "".join(f"{i}.png,image {i}\n" for i in range(4)))
    datamodule = CaptionFileDataModule(str(tmp_path / "pairs.csv"), image_size=8, in_channels=3, max_length=16)
    net = {**NET, "image": {**NET["image"], "in_channels": 3}}
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val/zero_shot_top1", mode="max")
    with pytest.raises(ValueError, match="model_metric.name=val/loss"):
        trainer(tmp_path, callbacks=[checkpoint]).fit(CLIPTask(net), datamodule=datamodule)


def huggingface_clip_folder(folder: Path) -> tuple[torch.nn.Module, Tokenizer]:
    """A tiny random transformers CLIPModel saved to `folder` with a tokenizer.json of the digit captions."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    # A tokenizer whose end-of-text id is not 2 (transformers reads eos_token_id=2 as OpenAI's argmax rule).
    tokenizer = train_tokenizer("char", [c for row in fill_templates(TEMPLATES, "0123456789") for c in row],
                                special_tokens=(PAD, BOS, UNK, EOS))  # fmt: skip
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 1), (EOS, 3)]
    )
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=40, eos_token_id=3, bos_token_id=1,
                         pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=8, patch_size=2, num_channels=1),
        projection_dim=16,
    )  # fmt: skip
    reference = transformers.CLIPModel(config).eval()
    reference.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return reference, tokenizer


def test_pretrained_huggingface_folder_brings_its_architecture_and_tokenizer(tmp_path: Path) -> None:
    reference, tokenizer = huggingface_clip_folder(tmp_path / "hf")
    task = CLIPTask(NET, pretrained=str(tmp_path / "hf"))
    assert task.hparams["pretrained"] is None and task.hparams["net"]["text"]["vocab_size"] == 64
    assert task.net.config.text.eot_token_id == 3 and task.net.config.image.activation == "quick_gelu"
    datamodule = digits_captions()
    metrics = trainer(tmp_path).test(task, datamodule=datamodule, verbose=False)[0]
    assert datamodule.tokenizer.get_vocab_size() == tokenizer.get_vocab_size()  # the folder's tokenizer is used
    assert "test/zero_shot_top1" in metrics
    # The zoo model computes what the reference computes on the same inputs.
    batch = next(iter(datamodule.test_dataloader()))
    with torch.no_grad():
        expected = reference(input_ids=batch["tokens"], pixel_values=batch["images"]).logits_per_image
        image_embeddings, text_embeddings, scale = task.net(batch["images"], batch["tokens"])
    torch.testing.assert_close(scale * image_embeddings @ text_embeddings.T, expected, atol=1e-4, rtol=1e-4)


def test_cli_trains_and_tests_clip_on_the_embedded_default(tmp_outputs: Path, capsys) -> None:
    code, _, err = run_in_process(["model=clip", "trainer.fast_dev_run=true", f"paths.log_dir={tmp_outputs}"], capsys)
    assert code == 0, err[-3000:]
    run = next((tmp_outputs / "clip").iterdir())
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= metrics["test/zero_shot_top1"] <= 1.0 and "test/text_to_image_R@1" in metrics
    assert (run / "clip_similarity.png").is_file()


def test_a_pretrained_folder_without_its_tokenizer_names_the_file_to_save(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # CLIPModel.save_pretrained without the processor's files
    with pytest.raises(ValueError, match=r"no tokenizer.json in .*hf; save the processor there too: CLIPProcessor"):
        CLIPTask(NET, pretrained=str(tmp_path / "hf"))
