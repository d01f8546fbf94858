"""Settings and files that used to end in a traceback, a silent guess or a page of output: each is one line now
(or an honest note), checked before the config is printed, and a refused run leaves no folder behind."""

from __future__ import annotations

import dataclasses
import logging
import re
import typing
from pathlib import Path

import lightning  # noqa: F401  (imported before any test captures stderr: Lightning's log handler keeps its stream)
import pytest
import torch
import torchvision

from tests.helpers import run_in_process
from zoo.app.cli import STARTED, RunFolders, keep_run_folder
from zoo.data.tokenizers import train_char_tokenizer
from zoo.models import clip, gpt, sequence_classifier, translation, vit  # noqa: F401  (every family's config)
from zoo.models.clip import CLIPConfig
from zoo.models.vit import ViTConfig, vit_from_pretrained
from zoo.nn.config import ModelConfig
from zoo.tasks.language_model import LanguageModelTask
from zoo.training.banners import DropBanners

QUIET = ["print_config=false", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
TINY_GPT = [
    "model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
    "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4", "data=text",
    "model.scheduler.warmup_steps=0", "trainer.limit_test_batches=1",
]  # fmt: skip


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    return lines[0]


# -- architecture sizes: one shared check, every family ----------------------------------------------------
def families() -> list[type[ModelConfig]]:
    found, todo = [], list(ModelConfig.__subclasses__())
    while todo:
        family = todo.pop()
        found.append(family)
        todo += family.__subclasses__()
    return sorted(found, key=lambda c: c.__name__)


def int_fields(family: type[ModelConfig]) -> set[str]:
    hints = typing.get_type_hints(family)
    ints = lambda hint: hint is int or int in typing.get_args(hint)
    return {f.name for f in dataclasses.fields(family) if ints(hints[f.name])}


def test_every_integer_of_an_architecture_is_a_checked_size() -> None:
    names = {"ViTConfig", "GPTConfig", "TranslationConfig", "CLIPConfig", "SequenceClassifierConfig"}
    assert {f.__name__ for f in families()} >= names
    for family in families():
        # Token ids are not sizes; neither is a num_classes whose 0 means "no head" (ViT), unlike the sequence
        # classifier's, which is a size.
        not_sizes = {
            n for n in int_fields(family) if n.endswith("_id") or (n == "num_classes" and n not in family.sizes)
        }
        assert int_fields(family) - not_sizes == set(family.sizes), family.__name__


@pytest.mark.parametrize("family", families(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [0, -2, 2.5, "8", True])
def test_every_size_must_be_a_positive_int(family: type[ModelConfig], bad) -> None:
    for name in family.sizes:
        with pytest.raises(ValueError, match=rf"^{family.family} {name} must be a positive int.*, got {bad!r}$"):
            family(**{name: bad})
    with pytest.raises(ValueError, match="vit depth must be a positive int, got 0"):
        CLIPConfig(image={"depth": 0})  # the towers of CLIP are checked as their own families


# -- keys, values and banners ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["trainer.max_epoch=3"],
         "unknown key 'trainer.max_epoch'; did you mean 'max_epochs'? (add a new key with +trainer.max_epoch=...)"),
        (["+trainer.epochs=3"],
         "unknown option 'epochs' for lightning.Trainer; did you mean 'min_epochs' or 'max_epochs'?"),
        (["model.net.dpeth=2"], "unknown key 'model.net.dpeth'; did you mean 'depth'?"),
        (["trainer.qqq=1"], "unknown key 'trainer.qqq'; valid keys in trainer: accelerator, accumulate_grad_batches,"),
        (["seed=abc"], "seed must be an int like its default 42, got 'abc'"),
    ],
)  # fmt: skip
def test_a_mistyped_key_or_value_is_named_in_a_short_line(args, expected: str, tmp_path: Path, capsys) -> None:
    code, out, err = run_in_process([*args, *QUIET, f"paths.log_dir={tmp_path}"], capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: {expected}"), line
    assert len(line) < 210, (len(line), line)


def test_banners_that_say_nothing_are_dropped_and_real_warnings_kept(reference_run: dict) -> None:
    printed = reference_run["out"] + reference_run["err"]
    assert "litlogger" not in printed and "TPU available" not in printed and "GPU available: False" not in printed
    assert "smaller than the logging interval" in reference_run["err"]  # a real warning still shows
    assert printed.count("`Trainer.fit` stopped: `max_epochs=4` reached.") == 1  # not again by Lightning's handler
    drop = DropBanners()
    record = lambda text: logging.LogRecord("lightning", logging.INFO, "", 0, text, None, None)
    assert not drop.filter(record("💡 Tip: For seamless cloud logging ... try installing [litlogger](...)"))
    assert drop.filter(record("GPU available: True (cuda), used: False"))  # a GPU left unused is news
    assert drop.filter(record("`Trainer.fit` stopped: `max_epochs=4` reached."))


def test_bad_input_is_answered_before_the_config_and_leaves_no_run_folder(tmp_path: Path, capsys) -> None:
    code, out, err = run_in_process(["model.net.depth=0", "print_config=true", f"paths.log_dir={tmp_path}"], capsys)
    assert code == 2 and error_line(err) == "error: vit depth must be a positive int, got 0"
    assert "config" not in out.splitlines() and "model_checkpoint" not in out  # no config tree before the error
    assert not (tmp_path / "vit").exists()  # neither the run folder nor the task folder it had to create

    folders = RunFolders()
    started = Path(folders.claim(str(tmp_path / "vit" / "run")))
    (started / ".hydra").mkdir()
    (started / "checkpoints").mkdir()
    assert not folders.discard_unstarted(started) and started.is_dir()  # it started: kept
    other = tmp_path / "not_claimed"
    (other / ".hydra").mkdir(parents=True)
    assert not folders.discard_unstarted(other) and other.is_dir()  # not this process's: kept
    refused = Path(folders.claim(str(tmp_path / "vit" / "refused")))
    (refused / "tensorboard").mkdir()  # what the loggers write as Lightning sets up
    assert folders.discard_unstarted(refused) and not refused.exists()
    trained = Path(folders.claim(str(tmp_path / "vit" / "trained")))
    (trained / "tensorboard").mkdir()
    keep_run_folder(trained)  # it took a training step (zoo.app.pipeline.kept_once_trained)
    assert (trained / STARTED).is_file()
    assert not folders.discard_unstarted(trained) and trained.is_dir()


# -- checkpoints and weights -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gpt")
    corpus = root / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    return root, corpus


def test_a_gpt_checkpoint_of_another_shape_is_one_line(gpt_checkpoint, capsys) -> None:
    root, corpus = gpt_checkpoint
    trained = [*TINY_GPT, f"data.path={corpus}", "trainer.max_steps=2", "trainer.val_check_interval=2", "test=false"]
    code, out, err = run_in_process([*trained, *QUIET, f"hydra.run.dir={root / 'run'}"], capsys)
    assert code == 0, err[-3000:]
    checkpoint = root / "run" / "checkpoints" / "last.ckpt"
    for mode in (["train=false"], ["trainer.max_steps=4"]):  # testing it, and resuming it
        args = [*TINY_GPT, f"data.path={corpus}", "model.net.n_embd=32", f"ckpt_path={checkpoint}", *mode, *QUIET]
        code, out, err = run_in_process([*args, f"paths.log_dir={root / 'other'}"], capsys)
        line = error_line(err)
        assert code == 2 and "does not fit the configured model" in line, line
        assert re.search(r"is \(\d+, 16\) in the checkpoint but \(\d+, 32\) here", line), line


def test_test_ckpt_best_without_a_best_checkpoint_says_so(gpt_checkpoint, capsys) -> None:
    root, corpus = gpt_checkpoint
    args = [*TINY_GPT, f"data.path={corpus}", "trainer.max_steps=2", "trainer.val_check_interval=5", *QUIET]
    code, out, err = run_in_process([*args, f"hydra.run.dir={root / 'no_best'}"], capsys)
    assert code == 0, err[-3000:]
    assert "test_ckpt=best: no best checkpoint was saved" in (root / "no_best" / "run.log").read_text()


def test_the_tokenizer_mismatch_names_each_side_correctly() -> None:
    trained_with = train_char_tokenizer(["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ"])
    data_has = train_char_tokenizer(["0123456789"])
    big, small = trained_with.get_vocab_size(), data_has.get_vocab_size()
    expected = rf"checkpoint was trained with a char \({big} tokens\) tokenizer, the data has a char \({small} tokens\)"
    for first, then, source in ((data_has, trained_with, "checkpoint"), (trained_with, data_has, "data")):
        task = LanguageModelTask(net={"vocab_size": None, "n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8})
        task._adopt_tokenizer(first, "data" if source == "checkpoint" else "checkpoint")
        with pytest.raises(ValueError, match=expected):
            task._adopt_tokenizer(then, source)


def torchvision_state_dict(path: Path, width: int, heads: int) -> torch.nn.Module:
    torch.manual_seed(0)
    reference = torchvision.models.VisionTransformer(
        image_size=8, patch_size=2, num_layers=1, num_heads=heads, hidden_dim=width, mlp_dim=2 * width, num_classes=10
    ).eval()
    torch.nn.init.normal_(reference.heads.head.weight)  # torchvision starts the head at zero: logits would all be 0
    torch.save(reference.state_dict(), path)
    return reference


def test_torchvision_weights_on_grayscale_images_sum_their_colour_channels(tmp_path: Path, capsys) -> None:
    reference = torchvision_state_dict(tmp_path / "tv.pth", 192, 3)
    model, notes = vit_from_pretrained(str(tmp_path / "tv.pth"), ViTConfig(image_size=8, in_channels=1, num_heads=4))
    assert model.config.in_channels == 1 and model.config.num_heads == 3  # 192 wide: torchvision's ViT-Ti, 3 heads
    assert "summed the 3-channel patch-embedding weights for 1-channel images" in notes
    gray = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(model.eval()(gray), reference(gray.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"3-channel patch weights, but the data has 4 channels \(data.in_channels\)"):
        vit_from_pretrained(str(tmp_path / "tv.pth"), ViTConfig(image_size=8, in_channels=4))
    # The command: digits are 8x8 grayscale.
    args = ["model=vit", f"model.pretrained={tmp_path / 'tv.pth'}", "trainer.fast_dev_run=true", *QUIET]
    code, out, err = run_in_process([*args, f"paths.log_dir={tmp_path / 'outputs'}"], capsys)
    assert code == 0, err[-3000:]
    assert "pretrained: summed the 3-channel patch-embedding weights for 1-channel images" in out


def test_torchvision_weights_of_a_non_standard_width_take_the_head_count_from_the_config(tmp_path: Path) -> None:
    reference = torchvision_state_dict(tmp_path / "tv.pth", 64, 2)
    images = torch.rand(2, 3, 8, 8)
    model, notes = vit_from_pretrained(str(tmp_path / "tv.pth"), ViTConfig(image_size=8, in_channels=3, num_heads=2))
    assert any(re.search(r"width 64 is not a torchvision size: num_heads=2 from model.net.num_heads", n) for n in notes)
    torch.testing.assert_close(model.eval()(images), reference(images), atol=1e-5, rtol=1e-5)
    wrong, _ = vit_from_pretrained(str(tmp_path / "tv.pth"), ViTConfig(image_size=8, in_channels=3, num_heads=4))
    assert (wrong.eval()(images) - reference(images)).abs().max() > 1e-3  # why the note says it must be right
    with pytest.raises(ValueError, match=r"width 64, .* model.net.num_heads=3 does not divide it"):
        vit_from_pretrained(str(tmp_path / "tv.pth"), ViTConfig(image_size=8, in_channels=3, num_heads=3))
