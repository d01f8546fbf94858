"""Every config group option composes, and the CLI runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import CONF, compose_config, run_in_process


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


STREAM_FAMILIES = {"images_stream": "vit", "captions_stream": "clip", "text_stream": "gpt",
                   "parallel_text_stream": "translation", "sequences_stream": "sequence_classifier"}  # fmt: skip


def shards_description(folder: Path) -> Path:
    """A shards folder's zoo.json alone (what the data=*_stream configs read when they compose)."""
    from zoo.data.tokenizers import train_char_tokenizer

    meta = {"kind": "images", "classes": ["a", "b"], "image_size": 8, "in_channels": 1, "max_length": 16,
            "padding_id": None, "tokenizer": train_char_tokenizer(["abc"]).to_str()}  # fmt: skip
    (folder / "zoo.json").write_text(json.dumps(meta))
    return folder


def test_every_group_has_options() -> None:
    for group in ("model", "attention", "data", "trainer", "logger", "callbacks", "paths", "hydra", "debug"):
        assert options(group), f"conf/{group}/ is empty"


@pytest.mark.parametrize(
    ("group", "option"),
    [
        (group, option)
        for group in (
            "model",
            "attention",
            "data",
            "trainer",
            "logger",
            "callbacks",
            "debug",
            "experiment",
            "hparams_search",
        )
        for option in options(group)
    ],
)
def test_config_option_composes(group: str, option: str, tmp_path: Path) -> None:
    overrides = [f"{group}={option}"]
    if group == "data":  # a dataset composes with the model family that reads it
        target = yaml.safe_load((CONF / "data" / f"{option}.yaml").read_text())["_target_"]
        family = {  # the data module's module or class -> what reads it (the default model, vit, reads images)
            "zoo.data.text.": "model=gpt",
            "zoo.data.parallel_text.": "model=translation",
            "zoo.data.captions.": "model=clip",
            "zoo.data.listops.": "model=sequence_classifier",
            "zoo.data.sequences.": "model=sequence_classifier",
            "zoo.data.huggingface.HFText": "model=gpt",
            "zoo.data.huggingface.HFParallelText": "model=translation",
            "zoo.data.huggingface.HFCaption": "model=clip",
            "zoo.data.huggingface.HFSequence": "model=sequence_classifier",
            "zoo.data.mqar.": "experiment=mqar",
        }
        overrides = [reader for key, reader in family.items() if target.startswith(key)] + overrides
    if option == "image_folder":  # the user must name the folder and its classes
        overrides += ["data.data_dir=images", "data.num_classes=3"]
    if option in ("hf_images", "hf_sequences"):  # the user must name the dataset's number of classes
        overrides += ["data.num_classes=3"]
    if group == "data" and option in STREAM_FAMILIES:  # shards: the model reads their sizes from zoo.json
        overrides = [f"model={STREAM_FAMILIES[option]}", *overrides, f"data.data_dir={shards_description(tmp_path)}"]
    cfg = compose_config(overrides, tmp_path)
    cfg.paths.output_dir = str(tmp_path)
    # Resolving everything catches broken interpolations; ??? (user must supply) is allowed.
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra")
    container = OmegaConf.to_container(OmegaConf.create(container), resolve=True, throw_on_missing=False)
    assert container["model"]["_target_"].startswith("zoo.tasks.")
    assert "_target_" in container["data"]
    assert container["optimized_metric"] == container["model_metric"]["name"]


def test_model_picks_its_default_dataset_and_data_overrides_it(tmp_path: Path) -> None:
    assert compose_config(["model=vit"], tmp_path).data._target_.endswith("DigitsDataModule")
    cfg = compose_config(["model=vit", "data=fashion_mnist"], tmp_path)
    assert cfg.data._target_.endswith("FashionMNISTDataModule")
    assert cfg.model.net.image_size == 28


def test_attention_group_reaches_the_model(tmp_path: Path) -> None:
    cfg = compose_config(["model=vit", "attention=full", "attention.rope=true"], tmp_path)
    assert cfg.model.net.attention.rope is True


def test_vit_fast_dev_run_writes_outputs(tmp_outputs: Path, capsys) -> None:
    code, out, err = run_in_process(["model=vit", "trainer.fast_dev_run=true", f"paths.log_dir={tmp_outputs}"], capsys)
    assert code == 0, err[-3000:]
    assert "test/acc" in out
    runs = list((tmp_outputs / "vit").iterdir())
    assert len(runs) == 1
    assert (runs[0] / ".hydra" / "config.yaml").is_file()
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert 0.0 <= metrics["test/acc"] <= 1.0


@pytest.mark.parametrize(
    ("overrides", "compiled"),
    [(["experiment=gpt_shakespeare_char"], True), (["experiment=gpt_shakespeare_char", "model.compile=false"], False),
     (["model=gpt"], False), (["model=vit"], False)],
)  # fmt: skip
def test_the_gpt_recipe_compiles_its_training_steps(overrides, compiled, tmp_path) -> None:
    """#19: the shakespeare recipe trains compiled (1.5x the fp32 eager step); model.compile=false turns it off."""
    from omegaconf import open_dict, read_write

    from zoo.app.pipeline import instantiate_task

    cfg = compose_config([*overrides, "logger=none"], tmp_path)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num, cfg.hydra.runtime.output_dir = 0, str(tmp_path)
    task = instantiate_task(cfg)
    assert (task.compile_backend == "inductor") is compiled


@pytest.mark.parametrize("native_bf16", [True, False], ids=["bf16-cpu", "avx2-cpu"])
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["experiment=gpt_shakespeare_char"], "auto"),  # the recipe's default (#19: fastest at equal loss)
        (["experiment=gpt_shakespeare_char", "trainer.precision=32-true"], None),
        (["experiment=gpt_shakespeare_char", "trainer.precision=bf16-mixed"], "bf16-mixed"),  # by name: kept
        (["model=vit"], "auto"),  # the main job
        (["experiment=translation_multi30k"], "auto"),
        (["model=gpt"], None),  # fp32 wherever a config does not choose otherwise
    ],
)
def test_the_precision_a_config_chooses_is_the_trainers(
    overrides: list[str], expected: str | None, native_bf16: bool, tmp_path, monkeypatch
) -> None:
    """`auto` trains in bf16-mixed on a CPU that computes bf16 natively and in fp32 on one that emulates it."""
    from omegaconf import open_dict, read_write

    from zoo.app.pipeline import instantiate_trainer
    from zoo.errors import ZooWarning
    from zoo.training import precision as precision_module
    from zoo.training.precision import MixedPrecision

    monkeypatch.setattr(precision_module, "native_bf16", lambda device: native_bf16 and device == "cpu")
    cfg = compose_config([*overrides, "logger=none"], tmp_path)
    with read_write(cfg.hydra), open_dict(cfg.hydra):  # as in a run: Hydra sets these at launch
        cfg.hydra.job.num, cfg.hydra.runtime.output_dir = 0, str(tmp_path)
    assert cfg.trainer.precision == (expected or "32-true")
    if expected == "bf16-mixed" and not native_bf16:  # asked by name on a CPU that emulates it: said, then kept
        with pytest.warns(ZooWarning, match="this CPU has no native bf16"):
            trainer = instantiate_trainer(cfg, [], [])
    else:
        trainer = instantiate_trainer(cfg, [], [])
    plugin = trainer.precision_plugin
    if expected == "auto":
        expected = "bf16-mixed" if native_bf16 else None
    if expected is None:
        assert not isinstance(plugin, MixedPrecision) and plugin.precision == "32-true"
    else:
        assert isinstance(plugin, MixedPrecision) and plugin.precision == expected


@pytest.mark.parametrize(("window", "noticed"), [(None, True), (8, False)], ids=["local.yaml", "window8"])
def test_a_local_window_over_the_whole_sequence_is_named_when_the_run_is_built(
    window: int | None, noticed: bool, tmp_path, caplog
) -> None:
    """`python run.py model=vit attention=local`: conf/attention/local.yaml's 256 covers the digits' 17 tokens."""
    from omegaconf import open_dict, read_write

    from zoo.app.pipeline import instantiate_task

    cfg = compose_config(["model=vit", "attention=local", "logger=none",
                          *([f"attention.window={window}"] if window else [])], tmp_path)  # fmt: skip
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num, cfg.hydra.runtime.output_dir = 0, str(tmp_path)
    with caplog.at_level("WARNING", logger="zoo"):
        instantiate_task(cfg)
    lines = [r.getMessage() for r in caplog.records if "local attention is exactly full attention" in r.getMessage()]
    assert lines == (["attention.window=256 covers all 17 tokens of this model's sequences: local attention is "
                      "exactly full attention here; set attention.window below 17 for a sliding window"]
                     if noticed else [])  # fmt: skip
