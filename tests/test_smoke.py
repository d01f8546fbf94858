"""Smoke matrix: every experiment config, every model x precision x gradient clipping, every trainer option
runs (one batch each, tiny generated data, CPU). A change of a default that breaks a recipe fails here.

The experiments run at their configured sizes (only the data paths point at tiny generated files), so a
recipe's own settings (bf16-mixed, clipping, fused optimisers, workers) are what is exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import (
    CONF,
    compose_config,
    run_cli,
    run_in_process,
    tiny_data_overrides,
    tiny_datasets,
)

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))
QUIET = ["print_config=false"]

TINY = {
    "vit": ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32"],
    "gpt": ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
            "model.sample.max_new_tokens=4", "data.eval_batches=1", "data.batch_size=4"],
    "translation": ["model=translation", "model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32",
                    "model.net.encoder_layers=1", "model.net.decoder_layers=1", "data.num_train=64",
                    "data.num_val=8", "data.num_test=8"],
    "rnn_translation": ["model=rnn_translation", "attention=additive", "model.net.embed_dim=16", "model.net.hidden=16",
                        "model.net.layers=2", "model.net.cell=lstm", "model.beam_size=2", "data.num_train=64",
                        "data.num_val=8", "data.num_test=8"],
    "clip": ["model=clip", "model.net.image.dim=16", "model.net.image.depth=1", "model.net.image.num_heads=2",
             "model.net.image.mlp_dim=32", "model.net.text.dim=16", "model.net.text.depth=1",
             "model.net.text.num_heads=2", "model.net.text.mlp_dim=32", "model.net.embed_dim=16"],
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_datasets(tmp_path_factory.mktemp("tiny_data"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_one_batch_of_train_val_and_test(experiment, tiny_data, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    data = tiny_data_overrides(compose_config([f"experiment={experiment}"], tmp_path), tiny_data)
    args = [f"experiment={experiment}", *data, "debug=fdr", *QUIET,
            f"hydra.run.dir={run_dir}", f"paths.data_dir={tmp_path / 'data'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-4000:]
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert any(key.startswith("test/") for key in metrics), metrics
    assert cfg.model_metric.name.split("/", 1)[1] in {key.split("/", 1)[1] for key in metrics}, metrics


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clipping", "clipping"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("model", sorted(TINY))
def test_every_model_trains_in_every_precision_with_and_without_clipping(
    model, precision, clip, tmp_path, capsys
) -> None:
    args = [*TINY[model], f"trainer.precision={precision}", f"trainer.gradient_clip_val={clip or 'null'}", "debug=fdr",
            *QUIET, f"hydra.run.dir={tmp_path / 'run'}", f"paths.data_dir={tmp_path / 'data'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-4000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics and all(value == value for value in metrics.values()), metrics  # no NaN


@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_trainer_option_composes(trainer, tmp_path) -> None:
    cfg = compose_config([f"trainer={trainer}"], tmp_path)
    assert cfg.trainer._target_ == "lightning.Trainer"
    OmegaConf.to_container(cfg.trainer, resolve=True)  # every interpolation resolves


def test_the_cpu_trainer_runs_one_step(tmp_path, capsys) -> None:
    args = [*TINY["vit"], "trainer=cpu", "debug=fdr", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"]
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-4000:]
    assert "test/acc" in json.loads((tmp_path / "run" / "metrics.json").read_text())


def test_the_ddp_cpu_trainer_runs_one_step_in_two_processes(tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli([*TINY["vit"], "trainer=ddp_cpu", "debug=fdr", *QUIET, f"hydra.run.dir={run_dir}"], timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "sync_dist" not in result.stdout + result.stderr  # epoch metrics say they are every rank's
    assert "test/acc" in json.loads((run_dir / "metrics.json").read_text())
