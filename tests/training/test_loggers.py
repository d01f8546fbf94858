"""zoo.training.loggers: media reach TensorBoard (and W&B, tests/test_wandb.py), CSV ignores them; gradient norms."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zoo.training.loggers import (
    GradientNormMonitor,
    confusion_matrix_figure,
    heatmap_figure,
    log_image,
    log_text_table,
    markdown_table,
    to_image_array,
    wants_media,
)


def trainer_with(logger: object, root: Path) -> L.Trainer:
    return L.Trainer(
        logger=logger,
        default_root_dir=str(root),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )


def test_to_image_array_accepts_figures_tensors_and_channel_first() -> None:
    assert to_image_array(torch.rand(3, 8, 5)).shape == (8, 5, 3)
    assert to_image_array(torch.rand(8, 5)).shape == (8, 5, 1)
    gray = to_image_array(np.full((4, 4), 0.5))
    assert gray.dtype == np.uint8 and int(gray[0, 0, 0]) == 128
    assert to_image_array(np.zeros((4, 4, 3), dtype=np.uint8)).shape == (4, 4, 3)
    figure = heatmap_figure(np.eye(3), ["a", "b", "c"], ["x", "y", "z"], title="t", annotate=True)
    image = to_image_array(figure)
    assert image.ndim == 3 and image.shape[-1] == 3 and image.std() > 0
    with pytest.raises(ValueError, match="1 or 3 channels"):
        to_image_array(np.zeros((5, 5, 7)))


def test_confusion_matrix_figure_normalises_rows() -> None:
    figure = confusion_matrix_figure(torch.tensor([[3, 1], [0, 4]]), ["cat", "dog"])
    assert isinstance(figure, Figure)
    axes = figure.axes[0]
    shown = axes.images[0].get_array()
    np.testing.assert_allclose(np.asarray(shown), [[0.75, 0.25], [0.0, 1.0]])
    assert [label.get_text() for label in axes.get_xticklabels()] == ["cat", "dog"]


def test_markdown_table_escapes_pipes_and_newlines() -> None:
    table = markdown_table(["prompt", "sample"], [["a|b", "line 1\nline 2"]])
    assert table.splitlines() == ["| prompt | sample |", "|---|---|", "| a\\|b | line 1<br>line 2 |"]


def test_media_reach_tensorboard(tmp_path: Path) -> None:
    logger = TensorBoardLogger(str(tmp_path), name="tb", version="")
    trainer = trainer_with(logger, tmp_path)
    assert wants_media(trainer)
    log_image(trainer, "test/confusion_matrix", confusion_matrix_figure(torch.eye(3)))
    log_image(trainer, "val/attention", torch.rand(6, 6))
    log_text_table(trainer, "val/samples", ["prompt", "sample"], [["hello", "world"], ["a", "b"]])
    logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert set(events.Tags()["images"]) == {"test/confusion_matrix", "val/attention"}
    text_tags = events.Tags()["tensors"]
    assert any(tag.startswith("val/samples") for tag in text_tags)
    text = events.Tensors(next(t for t in text_tags if t.startswith("val/samples")))[0].tensor_proto.string_val[0]
    assert b"| hello | world |" in text


def test_media_are_ignored_by_csv_and_off_rank_zero(tmp_path: Path) -> None:
    trainer = trainer_with(CSVLogger(str(tmp_path), name="csv", version=""), tmp_path)
    assert not wants_media(trainer)
    log_image(trainer, "test/confusion_matrix", np.zeros((4, 4)))  # nothing to do, and no error
    log_text_table(trainer, "val/samples", ["a"], [["b"]])
    assert not (tmp_path / "csv" / "metrics.csv").exists()
    with pytest.raises(ValueError, match="2 columns"):
        log_text_table(trainer, "val/samples", ["a", "b"], [["only one"]])
    module = L.LightningModule()  # not attached to a trainer (a notebook): also a no-op
    assert not wants_media(module)
    log_image(module, "x", np.zeros((2, 2)))


def test_log_image_saves_the_png_whatever_the_loggers_but_only_on_rank_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.image import imread

    trainer = trainer_with(CSVLogger(str(tmp_path), name="csv", version=""), tmp_path)
    log_image(trainer, "val/alignment", heatmap_figure(np.eye(3)), save_path=tmp_path / "alignments" / "val.png")
    assert imread(tmp_path / "alignments" / "val.png").std() > 0  # CSV shows no images; the file is written
    log_image(trainer, "val/gray", np.full((4, 5), 0.5), save_path=tmp_path / "gray.png")
    assert imread(tmp_path / "gray.png").shape[:2] == (4, 5)
    monkeypatch.setattr(L.Trainer, "is_global_zero", property(lambda self: False))
    log_image(trainer, "val/alignment", np.zeros((4, 4)), save_path=tmp_path / "rank1.png")
    assert not (tmp_path / "rank1.png").exists()


class TwoLayers(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 3)
        self.second = torch.nn.Linear(3, 2)


def test_gradient_norm_monitor_logs_the_total_and_per_module_norms() -> None:
    torch.manual_seed(0)
    module = TwoLayers()
    loss = module.second(module.first(torch.randn(5, 4))).square().sum()
    loss.backward()
    logged: dict[str, torch.Tensor] = {}
    module.log_dict = lambda values, **kwargs: logged.update(values)  # type: ignore[method-assign]

    class FakeTrainer:
        strategy = object()
        _logger_connector = type("LoggerConnector", (), {"should_update_logs": True})()

    GradientNormMonitor(group_depth=1).on_before_optimizer_step(FakeTrainer(), module, None)  # type: ignore[arg-type]
    grads = [p.grad for p in module.parameters()]
    expected_total = torch.sqrt(sum(g.square().sum() for g in grads))
    expected_first = torch.sqrt(module.first.weight.grad.square().sum() + module.first.bias.grad.square().sum())
    assert set(logged) == {"grad_norm/total", "grad_norm/first", "grad_norm/second"}
    torch.testing.assert_close(logged["grad_norm/total"], expected_total)
    torch.testing.assert_close(logged["grad_norm/first"], expected_first)
    # Off the logging interval nothing is computed.
    logged.clear()
    FakeTrainer._logger_connector.should_update_logs = False
    GradientNormMonitor().on_before_optimizer_step(FakeTrainer(), module, None)  # type: ignore[arg-type]
    assert logged == {}


def test_a_resumed_runs_csv_log_keeps_the_rows_before_the_resume(tmp_path: Path) -> None:
    """Lightning's CSVLogger deletes an existing metrics.csv as it starts; logger=csv continues it: the first
    attempt's rows stay, the resumed run's follow, and a new column only widens the header."""
    from zoo.training.loggers import ContinuingCSVLogger

    first = ContinuingCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    first.log_metrics({"train/loss": 2.0}, step=0)
    first.log_metrics({"train/loss": 1.5}, step=1)
    first.save()
    resumed = ContinuingCSVLogger(save_dir=str(tmp_path), name="csv", version="")  # the same run folder
    resumed.log_metrics({"train/loss": 1.0, "val/acc": 0.5}, step=2)
    resumed.save()
    with open(tmp_path / "csv" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["step"], row["train/loss"], row["val/acc"]) for row in rows] == [
        ("0", "2.0", ""), ("1", "1.5", ""), ("2", "1.0", "0.5")
    ]  # fmt: skip
