"""logger=wandb: offline without an API key (no network), run name/group from the config, and an offline run
directory that holds the metrics, learning rate, gradient norms, config and media the run logged; a dashboard that
needs no clicking (metric summaries and step axes, config sections, names, tags, group, checkpoint artifacts, a
summary run per sweep); and W&B Sweeps that run zoo through the agent's command line."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.hydra_config import HydraConfig

from tests.helpers import ROOT, compose_config, run_cli, run_in_process
from zoo.errors import ZooWarning
from zoo.training.loggers import wandb_api_key_available, wandb_logger, wandb_mode

NO_KEY = {"WANDB_API_KEY": "", "WANDB_MODE": "", "NETRC": "/nonexistent/netrc"}


@pytest.fixture(autouse=True)
def outside_any_hydra_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The logger asks Hydra whether it runs in a sweep (its name and group say so). Each test here starts outside
    any Hydra run: a config an earlier test of this worker composed (compose_config sets Hydra's global config, a
    hparams_search one in MULTIRUN mode) would otherwise make a plain logger a sweep's job."""
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a .wandb file (a LevelDB-style log: 32 KiB blocks of CRC | length | type | data
    chunks after a 7-byte ':W&B' header); wandb 0.2x+ ships no Python reader for it."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a record is complete
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def test_mode_follows_wandb_mode_then_the_api_key(tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    assert wandb_mode(NO_KEY) == "offline"
    assert wandb_mode({**NO_KEY, "WANDB_API_KEY": "k" * 40}) == "online"
    assert wandb_mode({**NO_KEY, "NETRC": str(netrc)}) == "online"
    assert wandb_api_key_available({**NO_KEY, "NETRC": str(netrc)})
    assert wandb_mode({**NO_KEY, "WANDB_API_KEY": "k" * 40, "WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode({**NO_KEY, "WANDB_MODE": "disabled"}) == "disabled"


def test_logger_goes_offline_without_a_key_and_names_the_run_after_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in NO_KEY.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "vit" / "2026-01-02_03-04-05"
    with caplog.at_level(logging.INFO):
        logger = wandb_logger(save_dir=str(run_dir), project="zoo", group="vit", tags=["a"], log_model=True)
    assert logger._offline is True
    assert logger.checkpoint_artifacts is True  # best and last checkpoints as artifacts, uploaded by wandb sync
    assert logger._wandb_init["name"] == "2026-01-02_03-04-05"
    assert logger._wandb_init["group"] == "vit"
    assert logger._wandb_init["tags"] == ["a"]
    assert "wandb sync" in caplog.text and "no W&B API key found" in caplog.text


def test_wandb_config_composes_from_the_run_config(tmp_path: Path) -> None:
    cfg = compose_config(["model=vit", "logger=wandb", "tags=[baseline]"], tmp_path)
    assert cfg.logger.wandb._target_ == "zoo.training.loggers.wandb_logger"
    assert cfg.logger.wandb.group == "vit"
    assert cfg.logger.wandb.name == "vit/full/digits"  # model/attention/data
    assert compose_config(["model=gpt", "logger=wandb", "attention=rope"], tmp_path).logger.wandb.name == (
        "gpt/rope/python_stdlib"
    )
    assert list(cfg.logger.wandb.tags) == ["baseline"]
    assert cfg.logger.wandb.save_dir == str(tmp_path)
    assert cfg.callbacks.gradient_norm._target_ == "zoo.training.loggers.GradientNormMonitor"
    assert "model_checkpoint" in cfg.callbacks  # the default callbacks stay


def history_keys(records: list[Any]) -> set[str]:
    return {item.key or "/".join(item.nested_key) for r in records if r.HasField("history") for item in r.history.item}


def records_of(records: list[Any], kind: str) -> list[Any]:
    return [getattr(r, kind) for r in records if r.HasField(kind)]


def run_config(records: list[Any]) -> dict[str, Any]:
    config = {item.key: json.loads(item.value_json) for c in records_of(records, "config") for item in c.update}
    (run,) = records_of(records, "run")
    return {**config, **{item.key: json.loads(item.value_json) for item in run.config.update}}


def test_offline_sweep_logs_metrics_lr_gradient_norms_config_and_media_one_run_per_job(tmp_outputs: Path) -> None:
    # A 2-job sweep in one process: each job must get its own W&B run, grouped by the sweep.
    result = run_cli(
        ["-m", "model=vit", "logger=wandb", "model.net.dim=16", "model.net.depth=1,2", "model.net.num_heads=2",
         "model.net.mlp_dim=32", "trainer.max_epochs=2", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "trainer.log_every_n_steps=1", "callbacks.rich_progress_bar=null",
         "logger.wandb.log_model=true", "tags=[smoke]", f"paths.log_dir={tmp_outputs}"],
        env={**NO_KEY, "WANDB_DATA_DIR": str(tmp_outputs / "wandb-data")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "no W&B API key found" in output and "wandb sync" in output
    (sweep_dir,) = (tmp_outputs / "vit" / "multirun").iterdir()
    runs = {}
    for job in ("0", "1"):
        (run_file,) = (sweep_dir / job / "wandb").glob("offline-run-*/run-*.wandb")
        records = wandb_records(run_file)
        (runs[job],) = records_of(records, "run")
        history = history_keys(records)
        for key in ("train/loss_step", "val/acc", "test/acc", "grad_norm/total", "trainer/global_step"):
            assert key in history, f"{key} not logged; logged: {sorted(history)}"
        assert any(key.startswith("lr-AdamW") for key in history), sorted(history)  # LearningRateMonitor
        assert "test/confusion_matrix/_type" in history  # an image entry, its PNG stored with the run
        assert list((run_file.parent / "files" / "media" / "images").rglob("*.png"))
        config = run_config(records)
        # readable sections; the attention config once, as its own section
        assert {"model", "attention", "data", "trainer", "callbacks", "run"} <= set(config) and "hydra" not in config
        assert config["model"]["net"]["depth"] == int(job) + 1  # the job's resolved run config
        assert "attention" not in config["model"]["net"] and config["attention"]["variant"] == "full"
        assert config["data"]["_target_"].endswith("DigitsDataModule") and config["run"]["seed"] == 42
        metrics = {m.name or m.glob_name: m for m in records_of(records, "metric")}
        assert metrics["val/acc"].summary.max and not metrics["val/acc"].summary.last  # the best, not the last
        assert metrics["val/acc"].step_metric == "epoch" and metrics["val/*"].step_metric == "epoch"  # per epoch
        assert metrics["train/*"].step_metric == "trainer/global_step"
        assert metrics["grad_norm/*"].step_metric == "trainer/global_step"
        artifacts = records_of(records, "artifact")  # W&B adds "latest" to the newest one itself
        assert [sorted(set(a.aliases) - {"latest"}) for a in artifacts] == [["best"], ["last"]]
        best = artifacts[0]
        assert best.type == "model" and json.loads(best.metadata)["monitor"] == "val/acc"
        kinds = {record.WhichOneof("record_type") for record in records}
        assert kinds & {"exit", "final", "footer"}  # the run was closed, not cut off
    assert runs["0"].run_id != runs["1"].run_id
    for job, run in runs.items():
        assert run.run_group == f"vit/{sweep_dir.name}" and run.display_name == f"vit/full/digits/{job}"
        assert list(run.tags) == ["smoke", f"sweep:{sweep_dir.name}"]
    # one more run for the whole sweep, in its group: the summary table and the plots
    (summary_file,) = (sweep_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(summary_file)
    (summary_run,) = records_of(records, "run")
    assert summary_run.run_group == f"vit/{sweep_dir.name}" and summary_run.display_name == f"{sweep_dir.name}/summary"
    history = history_keys(records)
    for key in ("sweep/summary", "sweep/optimization_history", "sweep/parallel_coordinates"):
        assert f"{key}/_type" in history, sorted(history)
    (table,) = (summary_file.parent / "files" / "media" / "table").glob("sweep/summary_*.table.json")
    assert [row[:2] for row in json.loads(table.read_text())["data"]] == [[0, "completed"], [1, "completed"]]
    assert len(list((summary_file.parent / "files" / "media" / "images").rglob("*.png"))) >= 2


def test_a_wandb_sweep_config_runs_zoo_through_the_agents_command_line(tmp_outputs: Path, capsys) -> None:
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    sweep_dir = tmp_outputs / "sweep"
    tiny = ["model.net.mlp_dim=32", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "callbacks=none", "print_config=false",
            f"paths.log_dir={tmp_outputs}"]  # fmt: skip
    code, out, err = run_in_process(
        ["hparams_search=vit_optuna", "hydra/sweeper=wandb", "hydra/sweeper/pruner=hyperband", *tiny,
         f"hydra.sweep.dir={sweep_dir}"],
        capsys,
    )  # fmt: skip
    assert code == 0, (out + err)[-3000:]
    assert f"wandb sweep {sweep_dir / 'wandb_sweep.yaml'}" in out
    assert not [p for p in sweep_dir.iterdir() if p.is_dir()]  # nothing was trained
    sweep = yaml.safe_load((sweep_dir / "wandb_sweep.yaml").read_text())
    assert sweep["method"] == "bayes" and sweep["metric"] == {"name": "val/acc", "goal": "maximize"}
    assert sweep["run_cap"] == 20 and sweep["early_terminate"]["type"] == "hyperband"
    assert sweep["parameters"]["model.optimizer.lr"] == {"distribution": "log_uniform_values", "min": 3e-4, "max": 5e-3}
    assert sweep["parameters"]["attention"] == {"values": ["full", "local", "linear", "rope"]}
    assert "attention.window" not in sweep["parameters"]  # searched only in local's trials: W&B cannot condition
    assert "left out, as W&B has no conditional parameters: attention.window" in out
    # What the agent runs for one suggestion: W&B's own expansion of the command's macros.
    suggestion = {key: p["values"][0] if "values" in p else p["max"] for key, p in sweep["parameters"].items()}
    macros = create_sweep_command_args({"args": {key: {"value": value} for key, value in suggestion.items()}})
    macros.update(env=["/usr/bin/env"], interpreter=[sys.executable], program=[sweep["program"]])
    command = []
    for part in create_sweep_command(sweep["command"]):
        command += macros[part[2:-1]] if part.startswith("${") else [part]
    agent_run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                               env={**os.environ, **NO_KEY, "WANDB_MODE": "offline"})  # fmt: skip
    assert agent_run.returncode == 0, agent_run.stderr[-3000:]
    assert not (tmp_outputs / "vit" / "multirun").exists()  # one plain run, not a search
    (run_file,) = (tmp_outputs / "vit").glob("*/wandb/offline-run-*/run-*.wandb")
    config = run_config(wandb_records(run_file))
    assert config["model"]["optimizer"]["lr"] == 5e-3 and config["data"]["batch_size"] == 32
    assert config["model"]["net"]["dim"] == 32 and config["model"]["net"]["depth"] == 2
    assert config["attention"]["variant"] == "full" and "window" not in config["attention"]


def test_a_sweep_over_a_key_the_config_lacks_is_refused_before_its_file_is_written() -> None:
    from zoo.app.search_space import parse_search_space
    from zoo.app.wandb_sweep import check_sweep_keys
    from zoo.errors import UsageError

    compose = lambda overrides: compose_config(overrides)  # noqa: E731 (a run's config, as the agents' runs compose it)
    searched = {"attention": "choice(full, local)", "attention.window": "choice(4, 8)"}
    check_sweep_keys(parse_search_space(searched, ["model=vit"]), compose)  # window: a key of attention=local only
    typo = parse_search_space({**searched, "model.net.deepth": "choice(2, 4)"}, ["model=vit"])
    with pytest.raises(UsageError) as info:
        check_sweep_keys(typo, compose)
    assert str(info.value) == (
        "the sweep sets 'model.net.deepth', which is not in the config its runs compose; did you mean 'depth'? "
        "(nothing written: every run would fail)"
    )
    check_sweep_keys(parse_search_space({"+model.net.extra": "choice(1, 2)"}, ["model=vit"]), compose)  # added: +


def test_a_wandb_sweep_over_a_missing_key_is_one_line_and_leaves_no_sweep_folder(tmp_outputs: Path, capsys) -> None:
    sweep_dir = tmp_outputs / "sweep"
    code, out, err = run_in_process(
        ["hparams_search=vit_optuna", "hydra/sweeper=wandb", "model.net.deepth=2,4", f"hydra.sweep.dir={sweep_dir}"],
        capsys,
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "'model.net.deepth'" in lines[0], (out + err)[-3000:]
    assert not sweep_dir.exists()


# Tiny runs of the text models, a few steps each; every media key they log, and the files behind it.
MEDIA_RUNS = {
    "gpt": (
        ["model=gpt", "data=text", "data.path={corpus}", "data.block_size=16", "data.eval_batches=1",
         "model.net.n_layer=1", "model.net.n_embd=16", "model.net.n_head=2", "trainer.max_steps=4",
         "trainer.val_check_interval=2", "model.sample.max_new_tokens=8"],
        {"val/samples": ["step", "prompt", "sample"]},
        [],
    ),
    "translation": (
        ["model=translation", "data.num_train=200", "data.num_val=8", "data.num_test=8", "data.max_digits=3",
         "data.vocab_size=300", "model.net.dim=16", "model.net.mlp_dim=32", "model.net.num_heads=2",
         "model.net.encoder_layers=1", "model.net.decoder_layers=1", "model.beam_size=2", "trainer.max_epochs=1"],
        {"val/samples": ["source", "reference", "hypothesis"], "test/samples": ["source", "reference", "hypothesis"]},
        ["val/alignment", "test/alignment"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(MEDIA_RUNS))
def test_offline_run_of_a_text_model_logs_its_sample_tables_and_alignment_images(model: str, tmp_outputs: Path) -> None:
    overrides, tables, images = MEDIA_RUNS[model]
    corpus = tmp_outputs / "corpus.txt"  # GPT's data.path
    corpus.write_text("First Citizen: Before we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 60)
    run_dir = tmp_outputs / model
    result = run_cli(
        [*(o.format(corpus=corpus) for o in overrides), "logger=wandb", "callbacks.rich_progress_bar=null",
         "print_config=false", f"paths.log_dir={tmp_outputs}", f"hydra.run.dir={run_dir}"],
        env=NO_KEY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = history_keys(wandb_records(run_file))
    media = run_file.parent / "files" / "media"
    for key, columns in tables.items():
        assert f"{key}/_type" in history, f"{key} not logged; logged: {sorted(history)}"
        (table, *_) = sorted((media / "table").glob(f"{key}_*.table.json"))
        content = json.loads(table.read_text())
        assert content["columns"] == columns and content["data"], content
    for key in images:
        assert f"{key}/_type" in history, f"{key} not logged; logged: {sorted(history)}"
        assert list((media / "images").glob(f"{key}_*.png"))
        stage = key.split("/")[0]
        assert list((run_dir / "alignments").glob(f"{stage}_epoch*.png"))  # the PNGs in the run directory stay


class Experiment:
    """What `define_wandb_metrics` calls on a W&B run: define_metric(name, step_metric=..., summary=...)."""

    def __init__(self) -> None:
        self.metrics: dict[str, dict[str, Any]] = {}

    def define_metric(self, name: str, **settings: Any) -> None:
        self.metrics[name] = settings


@pytest.mark.parametrize(
    ("overrides", "axis", "summary"),
    [
        (["model=vit"], "epoch", "max"),  # validates once an epoch; val/acc: higher is better
        (["model=vit", "trainer.val_check_interval=1.0"], "epoch", "max"),  # the whole epoch: still once
        (["model=vit", "trainer.val_check_interval=0.5"], "trainer/global_step", "max"),  # twice an epoch
        (["model=gpt"], "trainer/global_step", "min"),  # step-based: val/loss every 200 steps
    ],
)
def test_metrics_get_their_step_axis_and_the_best_value_as_summary(
    overrides: list[str], axis: str, summary: str, tmp_path: Path
) -> None:
    from zoo.training.loggers import define_wandb_metrics

    cfg = compose_config([*overrides, "logger=wandb"], tmp_path)
    experiment = Experiment()
    define_wandb_metrics(experiment, cfg)
    metrics = experiment.metrics
    assert metrics["val/*"] == {"step_metric": axis} and metrics["test/*"] == {"step_metric": axis}
    assert metrics["train/*"] == {"step_metric": "trainer/global_step"}
    assert metrics[cfg.model_metric.name] == {"step_metric": axis, "summary": summary}


def test_logger_settings_reach_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**NO_KEY, "WANDB_API_KEY": "k" * 40}.items():
        monkeypatch.setenv(name, value)
    online = wandb_logger(save_dir=str(tmp_path), project="p", entity="team", job_type="generate")
    assert online._offline is False  # a key: online unless told otherwise
    assert (online._wandb_init["project"], online._wandb_init["entity"]) == ("p", "team")
    assert online._wandb_init["job_type"] == "generate"
    assert wandb_logger(save_dir=str(tmp_path), offline=True)._offline is True  # offline=true wins over the key
    monkeypatch.setenv("WANDB_API_KEY", "")
    assert wandb_logger(save_dir=str(tmp_path), offline=False)._offline is False  # offline=false wins too
    with pytest.warns(ZooWarning, match="only the best and last checkpoints become artifacts"):
        every = wandb_logger(save_dir=str(tmp_path), log_model="all", offline=True)
    assert every.checkpoint_artifacts is True  # offline, "all" falls back to the best and last checkpoints
    default = wandb_logger(save_dir=str(tmp_path))
    assert default._log_model is False and default.checkpoint_artifacts is False  # log_model=false: no artifacts


def test_a_conditional_key_leaves_the_wandb_space_unless_a_fixed_choice_makes_it_hold() -> None:
    from zoo.app.search_space import parse_search_space
    from zoo.app.wandb_sweep import unconditional

    conditions = {"attention.window": {"attention": ["local"]}}
    searched = {"attention": "choice(full, local)", "attention.window": "choice(4, 8)"}
    space = parse_search_space(searched)
    assert unconditional(space, conditions) == ["attention.window"] and set(space.searched) == {"attention"}
    space = parse_search_space({"attention.window": "choice(4, 8)"}, ["attention=local"])
    assert unconditional(space, conditions) == [] and set(space.searched) == {"attention.window"}
    space = parse_search_space({"attention.window": "choice(4, 8)"}, ["attention=full"])
    assert unconditional(space, conditions) == ["attention.window"] and not space.searched
