"""What a newcomer sees: every run's console holds zoo's lines and no third-party tip or warning, a training run
ends with the command that uses its checkpoint (each family its own), the other modes print their summary only
(print_config=true shows the config), and the progress bar and model summary say only what is true."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import run_cli, run_in_process
from zoo.training.banners import DropBanners
from zoo.training.callbacks import ModelSummary, ProgressBar

ONE_EPOCH = ["trainer.max_epochs=1", "+trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
             "trainer.limit_test_batches=1", "trainer.log_every_n_steps=1"]  # fmt: skip
TINY_GPT = ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
            "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4", "trainer.max_steps=2",
            "trainer.val_check_interval=2"]  # fmt: skip
TINY_CLIP = ["model=clip", "model.net.embed_dim=16", "model.net.image.dim=16", "model.net.image.depth=1",
             "model.net.image.num_heads=2", "model.net.image.mlp_dim=32", "model.net.text.dim=16",
             "model.net.text.depth=1", "model.net.text.num_heads=2", "model.net.text.mlp_dim=32"]  # fmt: skip
THIRD_PARTY = ("Tip:", "Warning", "warn", "FLOPs", "is not supported by the model summary", "No CUDA runtime")


def test_the_banner_filter_drops_every_lightning_tip_and_torchs_cuda_note() -> None:
    record = lambda text: logging.LogRecord("lightning", logging.INFO, "", 0, text, None, None)
    drop = DropBanners()
    tip = "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels](https://pypi.org/...)"
    assert not drop.filter(record(tip))
    assert not drop.filter(record("No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'"))
    assert drop.filter(record("`Trainer.fit` stopped: `max_steps=600` reached."))


def test_a_run_bounded_by_steps_shows_them_not_a_negative_epoch_total() -> None:
    bar = ProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1, max_steps=600)
    assert bar._get_train_description(0).strip() == "Steps of 600"
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_the_model_summary_has_no_flops_column(capsys) -> None:
    data = [(" ", ["0"]), ("Name", ["net"]), ("Type", ["ViT"]), ("Params", ["136 K"]), ("Mode", ["train"]),
            ("FLOPs", ["0"])]  # fmt: skip
    ModelSummary.summarize(data, 136_000, 136_000, 0.545, {"train": 1, "eval": 0}, 0)
    out = capsys.readouterr().out
    assert "ViT" in out and "136 K" in out and "FLOP" not in out and "0.545" in out


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`python run.py model=vit` (one short epoch) in a fresh interpreter, as a newcomer starts it."""
    root = tmp_path_factory.mktemp("quiet")
    result = run_cli(["model=vit", *ONE_EPOCH, "print_config=false", f"hydra.run.dir={root / 'vit'}"], cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"root": root, "out": result.stdout, "err": result.stderr}


def test_a_vit_run_shows_no_third_party_line_and_ends_with_its_predict_command(vit_run) -> None:
    printed = vit_run["out"] + vit_run["err"]
    for text in THIRD_PARTY:
        assert text not in printed, f"{text!r} in:\n{printed[-4000:]}"
    assert "Trainable params" in printed  # the summary is there, without FLOPs
    last = vit_run["out"].strip().splitlines()[-1].strip()
    assert last.startswith("python run.py model=vit ckpt_path=") and "mode=predict inputs=" in last, last


def test_modes_print_their_summary_only_and_print_config_true_shows_the_config(vit_run, capsys) -> None:
    checkpoint = vit_run["root"] / "vit" / "checkpoints" / "last.ckpt"
    for print_config, shown in ((None, False), ("true", True)):
        args = ["mode=export", f"ckpt_path={checkpoint}", f"hydra.run.dir={vit_run['root'] / 'export'}"]
        code, out, err = run_in_process([*args, *([f"print_config={print_config}"] if print_config else [])], capsys)
        assert code == 0, (out + err)[-3000:]
        assert ("── model" in out) == shown, out[-3000:]
        assert "exported the vit model to" in out.strip().splitlines()[-1]


def test_every_family_ends_with_its_own_next_command(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    runs = {
        "gpt": ([*TINY_GPT, "data=text", f"data.path={corpus}"], "mode=generate prompt="),
        "clip": ([*TINY_CLIP, *ONE_EPOCH], "mode=zero_shot inputs="),
    }
    for family, (args, expected) in runs.items():
        run_dir = tmp_path / family
        code, out, err = run_in_process([*args, "print_config=false", "logger=csv", f"hydra.run.dir={run_dir}"], capsys)
        assert code == 0, (out + err)[-3000:]
        last = out.strip().splitlines()[-1].strip()
        assert last.startswith(f"python run.py model={family} ckpt_path=") and expected in last, last
        assert "Epoch 0/-2" not in out + err
        if family == "clip":  # the examples it names are there, and the command runs
            assert len(list((run_dir / "examples").glob("*.png"))) == 10
            code, out, err = run_in_process([*shlex.split(last)[2:], f"hydra.run.dir={tmp_path / 'zs'}"], capsys)
            assert code == 0 and (tmp_path / "zs" / "zero_shot.csv").is_file(), (out + err)[-3000:]


def test_one_batch_debug_run_says_what_its_missing_checkpoint_means(tmp_path: Path, capsys) -> None:
    args = [*TINY_CLIP, "debug=fdr", "print_config=false", f"paths.log_dir={tmp_path}"]
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-3000:]
    assert "no validation ran" not in out + err and "fast_dev_run saves no checkpoint" in out + err


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("gpt", 'mode=generate prompt="ROMEO:" max_new_tokens=200'),
        ("translation", 'mode=translate text="ein Mann fährt Fahrrad."'),
    ],
)
def test_gpt_and_translation_runs_end_with_their_command(family: str, expected: str, tmp_path: Path, capsys) -> None:
    from tests.helpers import compose_config
    from zoo.app.hints import next_command

    cfg = compose_config([f"model={family}"], output_dir=tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    next_command(cfg)
    last = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert last.startswith(f"python run.py model={family} ckpt_path=") and last.endswith(expected), last
