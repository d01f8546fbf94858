"""Bad input: every kind is answered by one line that names the bad value and what would be valid, exit
status 2, no traceback (unless HYDRA_FULL_ERROR=1), and nothing already on disk is lost.

Each case runs `python run.py <args>` in this process (run.py executed as __main__ with runpy: the same
code path as the command line, without a new interpreter per case). The same table is in README.md
(Troubleshooting, Reading an error).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import CORPUS
from tests.helpers import run_in_process as run_cli
from zoo.attention.registry import VARIANTS
from zoo.data.tokenizers import train_tokenizer

QUIET = ["print_config=false", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
TINY_VIT = ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32"]
TINY_GPT = [
    "model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
    "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4",
]  # fmt: skip
TINY_TRANSLATION = ["model=translation", "model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32"]
ONE_STEP = ["trainer.max_epochs=1", "+trainer.limit_train_batches=1", "trainer.limit_val_batches=1"]
OTHER_CORPUS = "0123456789 +-*/=<>\n" * 80  # another alphabet, of another size
CORPUS_VOCAB, OTHER_VOCAB = (train_tokenizer("char", [text]).get_vocab_size() for text in (CORPUS, OTHER_CORPUS))


def snapshot(root: Path) -> dict[str, str]:
    """Every file (its bytes' hash) and folder ("folder") under `root`, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in root.rglob("*")
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, trained_runs) -> dict[str, Path]:
    """Input files and two earlier runs (a ViT and a GPT, with checkpoints; copies of the session's trained runs,
    tests/conftest.py) that no bad input may harm."""
    root = tmp_path_factory.mktemp("errors")
    files = root / "files"
    files.mkdir()
    (files / "corpus.txt").write_text(CORPUS)
    (files / "other_corpus.txt").write_text(OTHER_CORPUS)
    (files / "empty.txt").write_text("")
    (files / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin-1") * 50)
    (files / "train.de").write_text("ein Haus\nzwei Katzen\ndrei Hunde\n")
    (files / "train.en").write_text("a house\ntwo cats\n")
    (files / "pairs.tsv").write_text("ein Haus\ta house\nzwei Katzen\ttwo cats\n")
    (files / "latin1.tsv").write_bytes("caf\u00e9\tcoffee\n".encode("latin-1") * 5)
    (files / "bad_data_dir").mkdir()
    torch.save(torch.ones(3), files / "tensor.ckpt")
    (files / "garbage.ckpt").write_bytes(b"\x00\x01 not a checkpoint " * 64)

    class Planted:
        def __reduce__(self):
            return os.mkdir, (str(files / "code_ran"),)

    torch.save({"state_dict": {}, "hyper_parameters": {"x": Planted()}}, files / "evil.ckpt")

    outputs = root / "outputs"
    vit = trained_runs["vit_tiny"].copy_to(outputs / "vit" / "2025-01-31_12-00-00") / "checkpoints" / "last.ckpt"
    gpt = trained_runs["gpt_tiny"].copy_to(outputs / "gpt" / "2025-01-31_12-00-00") / "checkpoints" / "last.ckpt"
    truncated = files / "truncated.ckpt"
    truncated.write_bytes(vit.read_bytes()[: vit.stat().st_size // 2])
    return {"root": root, "files": files, "outputs": outputs, "vit": vit, "gpt": gpt, "truncated": truncated}


# (id, arguments, fragments the error line must contain: the bad value and what would be valid[, xfail mark])
# {files}, {vit}, {gpt}, {truncated}, {outputs} are filled in from the fixture.
CASES = [
    ("unknown model", ["model=vitt"], ["model 'vitt'", "valid choices", "vit"]),
    ("unknown attention", ["attention=bigbird"], ["attention 'bigbird'", "full", "sparse"]),
    ("unknown attention variant", ["attention.variant=bigbird"], ["'bigbird'", "axial", "compressed"]),
    ("unknown data", ["data=imagenet"], ["data 'imagenet'", "digits"]),
    ("unknown trainer option", ["trainer=tpu"], ["trainer 'tpu'", "cpu"]),
    ("unknown config key", ["trainer.epochs=3"], ["'trainer.epochs'", "max_epochs", "+trainer.epochs"]),
    ("unknown trainer argument", ["+trainer.epochs=3"], ["'epochs'", "max_epochs"]),
    ("value of the wrong type", ["trainer.max_epochs=ten"], ["trainer.max_epochs", "'ten'", "an int"]),
    ("unknown mode", ["mode=serve"], ["mode 'serve'", "train"]),
    ("dim not divisible by heads", [*TINY_VIT, "model.net.dim=30", "model.net.num_heads=4"], ["dim=30", "num_heads"]),
    ("window <= 0", ["attention=local", "attention.window=0"], ["window", "0", "positive"]),
    ("bidirectional attention in a causal model", ["model=gpt", "attention=compressed"],
     ["'compressed' is bidirectional only", "causal", "valid choices", "sparse", "model=gpt has no non-causal",
      "variant=compressed fits model=bert, model=sequence_classifier, model=vit"]),
    ("bidirectional attention in Llama", ["model=llama", "attention=compressed"],
     ["model=llama has no non-causal attention", "variant=compressed fits model=bert, model=sequence_classifier"]),
    ("bidirectional attention in the translation decoder",
     [*TINY_TRANSLATION, "data=parallel_text", "data.train={files}/pairs.tsv", "data.val={files}/pairs.tsv",
      "data.test={files}/pairs.tsv", "attention=compressed"],
     ["'compressed' is bidirectional only",
      "in model=translation it fits model.net.encoder_attention={variant:compressed}"]),
    ("no attention for the RNN as a group choice", ["model=rnn_translation", "attention=null"],
     ["attention=null", "model=rnn_translation model.net.attention=null", "valid choices"]),
    ("RoPE in the RNN's cross-attention", ["model=rnn_translation", "attention=rope"],
     ["attention.rope=true (attention=rope) would be ignored", "attention=full | additive"]),
    ("a sequence position bias on a patch grid", [*TINY_VIT, "attention.position_bias=alibi"],
     ["biases distances along a token sequence", "model=vit has no token-sequence attention",
      "position_bias=alibi fits model=bert, model=gpt, model=sequence_classifier, model=translation"]),
    ("a sequence position bias in CLIP's image tower", ["model=clip", "attention.position_bias=t5"],
     ["in model=clip it fits model.net.attention=null +model.net.text.attention.position_bias=t5 (the text tower)"]),
    ("axial row length that misses the patch grid", ["attention=axial", "attention.row_length=3"],
     ["row_length=3", "4x4 patch grid", "null or 4"]),
    ("position bias without scores", ["attention=linear", "attention.position_bias=alibi"],
     ["'alibi'", "'linear'", str(sorted(name for name, k in VARIANTS.items() if k.supports_position_bias))]),
    ("kv_heads not dividing the heads", [*TINY_VIT, "attention.kv_heads=3"], ["kv_heads=3", "num_heads=2", "[1, 2]"]),
    ("image size not divisible by patch", ["model.net.patch_size=3"], ["patch_size=3", "image_size=8", "divisible"]),
    ("devices > available", ["trainer.devices=4096"], ["trainer.devices=4096", "valid: 1.."]),
    ("no GPU for accelerator=gpu", ["trainer.accelerator=gpu"], ["accelerator=gpu", "no GPU", "cpu"]),
    ("unknown accelerator", ["trainer.accelerator=quantum"], ["'quantum'", "cpu"]),
    ("unknown precision", ["trainer.precision=fp8"], ["'fp8'", "32-true", "bf16-mixed"]),
    ("unknown test checkpoint", ["test_ckpt=worst"], ["'worst'", "'best'", "'last'"]),
    ("data of another model family", ["model=vit", "data=text", "data.path={files}/corpus.txt"],
     ["data.image_size", "dataset made for the model"]),
    ("mandatory value not given", ["model=gpt", "data=text"], ["data.path", "Missing mandatory value"]),
    ("missing data path", [*TINY_GPT, "data=text", "data.path={files}/missing.txt"], ["missing.txt"]),
    ("empty data file", [*TINY_GPT, "data=text", "data.path={files}/empty.txt"], ["empty.txt", "empty"]),
    ("data folder without images", ["data=image_folder", "data.data_dir={files}/bad_data_dir", "data.num_classes=2"],
     ["bad_data_dir"]),
    ("undecodable text file", [*TINY_GPT, "data=text", "data.path={files}/latin1.txt"], ["latin1.txt", "utf-8"]),
    ("parallel files with different line counts",
     [*TINY_TRANSLATION, "data=parallel_text", "data.train=[{files}/train.de,{files}/train.en]",
      "data.val={files}/pairs.tsv", "data.test={files}/pairs.tsv"], ["train.de", "3 lines", "train.en", "2"]),
    ("undecodable parallel file",
     [*TINY_TRANSLATION, "data=parallel_text", "data.train={files}/latin1.tsv", "data.val={files}/pairs.tsv",
      "data.test={files}/pairs.tsv"], ["latin1.tsv", "utf-8"]),
    ("checkpoint that does not exist", ["train=false", "ckpt_path={files}/nope.ckpt"], ["nope.ckpt", "not a file"]),
    ("truncated checkpoint", ["train=false", "ckpt_path={truncated}"], ["truncated.ckpt", "truncated or corrupt"]),
    ("corrupt checkpoint", ["train=false", "ckpt_path={files}/garbage.ckpt"], ["garbage.ckpt", "corrupt"]),
    ("not a Lightning checkpoint", ["train=false", "ckpt_path={files}/tensor.ckpt"], ["tensor.ckpt", "state_dict"]),
    ("checkpoint holding code", ["train=false", "ckpt_path={files}/evil.ckpt"], ["evil.ckpt", "refused", "mkdir"]),
    ("checkpoint of another family (gpt into vit)", ["model=vit", "train=false", "ckpt_path={gpt}"],
     ["LanguageModelTask", "model=gpt"]),
    ("checkpoint of another family (vit into generate)", ["model=gpt", "mode=generate", "ckpt_path={vit}"],
     ["ImageClassificationTask", "model=vit"]),
    ("checkpoint of another configuration", ["model=vit", "train=false", "ckpt_path={vit}"],
     ["does not fit", "16", "64", "overrides it was trained with"]),
    ("tokenizer / checkpoint vocabulary mismatch",
     [*TINY_GPT, "data=text", "data.path={files}/other_corpus.txt", "train=false", "ckpt_path={gpt}"],
     [f"the checkpoint was trained with a char ({CORPUS_VOCAB} tokens) tokenizer, the data has a char "
      f"({OTHER_VOCAB} tokens) one"]),
    ("block size exceeded at generation", ["model=gpt", "mode=generate", "ckpt_path={gpt}", f"prompt={'tobe' * 10}"],
     ["40 tokens", "block_size=16"]),
    ("ckpt_path=last without a checkpoint", ["ckpt_path=last"], ["last.ckpt", "auto_resume"]),
    ("auto_resume of a folder that is no run", ["auto_resume={files}"], ["auto_resume=", "not a run directory"]),
    ("evaluation without a checkpoint", ["train=false"], ["train=false", "ckpt_path"]),
    ("malformed override", ["model.net.dim=[64"], ["model.net.dim=[64"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["model=rnn_translation", "attention=null"], "model=rnn_translation model.net.attention=null; valid choices: "
                                                  "additive, axial"),
     (["attention=full,null", "-m"], "model=rnn_translation model.net.attention=null"),
     (["logger=null"], "logger=null is not a logger option; leave the group out with ~logger, or pick one of: csv")],
)  # fmt: skip
def test_a_null_config_group_is_one_line_naming_the_override_that_works(args, fragment) -> None:
    """Hydra's parser takes no null for a group ("Config group override must be a string or a list"), naming no key."""
    from zoo.app.cli import RunFolders, prepare_arguments
    from zoo.errors import UsageError

    with pytest.raises(UsageError) as info:
        prepare_arguments(args, RunFolders())
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert prepare_arguments(["model=rnn_translation", "model.net.attention=null"], RunFolders())  # the override


@pytest.mark.parametrize(
    ("args", "fragments"), [pytest.param(*case[1:3], id=case[0], marks=case[3:]) for case in CASES]
)
def test_bad_input_gets_one_line_exit_2_and_harms_nothing(world, args, fragments, capsys) -> None:
    """Every folder a case names (the outputs root and its runs, checkpoints, the data files) is under world's
    root: after the refusal it holds the same files with the same bytes, and no new file or folder (no run)."""
    before = snapshot(world["root"])
    args = [a.format(**{k: str(v) for k, v in world.items()}) for a in args]
    code, out, err = run_cli([*args, *QUIET, f"paths.log_dir={world['outputs']}"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    after = snapshot(world["root"])
    assert {k: after.get(k) for k in before} == before  # every earlier file is still there, unchanged
    assert sorted(set(after) - set(before)) == []  # and nothing new: no run folder, no log, no cache
    assert not (world["files"] / "code_ran").exists()


# Refused runs with the default loggers and callbacks (what writes into a run folder as Lightning sets up).
REFUSALS = [
    ("bidirectional attention in GPT",
     [*TINY_GPT, "data=text", "data.path={files}/corpus.txt", "attention=compressed"]),
    ("negative learning rate", [*TINY_VIT, "model.optimizer.lr=-1"]),
    ("local attention's chunk_size=0", [*TINY_VIT, "attention=local", "attention.chunk_size=0"]),
    ("CLIP folder without tokenizer.json", ["model=clip", "model.pretrained={files}/clip_without_tokenizer"]),
    ("a launcher of no jobs", ["-m", *TINY_VIT, "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"]),
    ("auto_resume of another family's run", ["auto_resume={vit_run}", "model=gpt", "data=text",
                                             "data.path={files}/corpus.txt"]),
]  # fmt: skip


def test_refused_runs_leave_no_file_behind_not_even_in_the_run_they_refuse(world, capsys) -> None:
    (world["files"] / "clip_without_tokenizer").mkdir(exist_ok=True)
    (world["files"] / "clip_without_tokenizer" / "config.json").write_text("{}")
    names = {k: str(v) for k, v in world.items()} | {"vit_run": str(world["vit"].parents[1])}
    before = snapshot(world["root"])
    for name, args in REFUSALS:
        args = [a.format(**names) for a in args]
        code, out, err = run_cli([*args, "print_config=false", f"paths.log_dir={world['outputs']}"], capsys)
        assert code == 2 and err.strip().splitlines()[-1].startswith("error: "), (name, (out + err)[-3000:])
        assert snapshot(world["root"]) == before, name  # no file or folder appeared, none changed (run.log included)


# A resume of a run with a configuration its checkpoint does not fit. GPT builds its network from the data's
# vocabulary, so Lightning's own check came only inside fit, after the CSV logger had deleted the run's
# metrics.csv and TensorBoard had opened a new event file in it; the check now sees the whole network before fit.
RESUMES_THAT_DO_NOT_FIT = [
    ("gpt", ["attention=additive"], "net.blocks.0.self_attn.kernel.score_vectors"),  # another attention variant
    ("gpt", ["attention.kv_heads=1"], "net.blocks.0.self_attn.in_proj.weight is (48, 16) in the checkpoint"),
    ("vit", ["attention.kv_heads=1"], "in_proj.weight is (48, 16) in the checkpoint but (32, 16) here"),
]


@pytest.mark.parametrize(
    ("family", "changes", "fragment"),
    RESUMES_THAT_DO_NOT_FIT,
    ids=[f"{f}-{c[0]}" for f, c, _ in RESUMES_THAT_DO_NOT_FIT],
)
def test_a_refused_resume_leaves_the_run_it_refuses_byte_for_byte(world, family, changes, fragment, capsys) -> None:
    run = world[family].parents[1]
    before = snapshot(world["root"])
    # logger=default: CSV and TensorBoard, both writing into the run's folder when they start
    code, out, err = run_cli([f"auto_resume={run}", *changes, "logger=default", "print_config=false"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (out + err)[-3000:]
    assert "does not fit the configured model" in lines[0] and fragment in lines[0], lines[0]
    assert snapshot(world["root"]) == before  # the run: same files, same bytes, no new file or folder


def test_hydra_full_error_shows_the_traceback(world, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(Exception, match="dim must be divisible by num_heads"):
        run_cli(["model.net.dim=30", "model.net.num_heads=4", *QUIET, f"paths.log_dir={world['outputs']}"], capsys)
    assert os.environ["HYDRA_FULL_ERROR"] == "1"


def test_a_resolver_nested_in_an_interpolation_reports_its_own_message() -> None:
    """OmegaConf re-raises a resolver's error once per nesting level (`${r:${d}}`), chained by __context__: the
    one line is the resolver's message, not "DataError raised while resolving interpolation: ..."; a bug in a
    resolver keeps OmegaConf's error (and so its traceback)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    from zoo.app.reporting import unwrap, user_error_message
    from zoo.errors import DataError

    def refuse(path: str) -> None:
        raise DataError(f"data.data_dir={path!r} is not a shards folder")

    def crash(path: str) -> None:
        raise ZeroDivisionError(path)

    OmegaConf.register_new_resolver("test_refuse", refuse, replace=True)
    OmegaConf.register_new_resolver("test_crash", crash, replace=True)
    refusing = OmegaConf.create({"d": "/x", "value": "${test_refuse:${d}}"})
    with pytest.raises(InterpolationResolutionError) as refused:
        OmegaConf.to_container(refusing, resolve=True)
    assert user_error_message(refused.value) == "data.data_dir='/x' is not a shards folder"
    crashing = OmegaConf.create({"d": "/x", "value": "${test_crash:${d}}"})
    with pytest.raises(InterpolationResolutionError) as crashed:
        OmegaConf.to_container(crashing, resolve=True)
    assert unwrap(crashed.value) is crashed.value
