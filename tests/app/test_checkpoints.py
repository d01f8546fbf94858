"""One reader for every checkpoint: compiled runs, and checkpoints in the format older zoo versions wrote
(`net._orig_mod.` names of a compiled run, the old identity marker), load for testing (`train=false
ckpt_path=`), generation, translation and as `model.pretrained`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import run_in_process
from zoo.tasks.base import compile_backend

QUIET = ["print_config=false", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
VIT = ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32"]
GPT = ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
       "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4", "trainer.max_steps=2",
       "trainer.val_check_interval=2"]  # fmt: skip
TRANSLATION = ["model=translation", "model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32",
               "model.net.encoder_layers=1", "model.net.decoder_layers=1", "data.num_train=64", "data.num_val=8",
               "data.num_test=8", "trainer.max_epochs=1", "model.alignment_plots=false"]  # fmt: skip
ONE_EPOCH = ["trainer.max_epochs=1", "+trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "test=false"]


def train(args: list[str], run_dir: Path, capsys) -> Path:
    code, out, err = run_in_process([*args, *QUIET, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 0, (out + err)[-3000:]
    return run_dir / "checkpoints" / "last.ckpt"


def as_older_zoo_wrote_it(path: Path, family: str) -> Path:
    """The checkpoint as zoo wrote it before the layering round: a compiled network's names under
    net._orig_mod., the identity as {"task", "model"} and, for GPT, a separate model_family key."""
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"] = {k.replace("net.", "net._orig_mod.", 1): v for k, v in checkpoint["state_dict"].items()}
    checkpoint["zoo"] = {"task": checkpoint["zoo"]["task"], "model": family}
    if family == "gpt":
        checkpoint["model_family"] = "gpt"
    old = path.with_name(f"old-{family}.ckpt")
    torch.save(checkpoint, old)
    return old


def test_compile_option_names_a_backend() -> None:
    assert compile_backend(False) is None and compile_backend(True) == "inductor"
    assert compile_backend("aot_eager") == "aot_eager"
    with pytest.raises(ValueError, match="unknown model.compile backend 'fast'.*inductor"):
        compile_backend("fast")


def test_compile_serves_training_steps_only() -> None:
    """model.compile: the compiled network in training with gradients; eval and no-grad calls (validation, test,
    sampling) get the plain one, so they compile nothing; the module tree keeps the plain names."""
    from zoo.tasks.classification import ImageClassificationTask

    net = {"image_size": 8, "in_channels": 1, "num_classes": 10, "patch_size": 4, "dim": 16, "depth": 1,
           "num_heads": 2, "mlp_dim": 32}  # fmt: skip
    task = ImageClassificationTask(net=net, compile="aot_eager")
    task.configure_model()
    compiled = task.network()
    assert compiled is not task.net and isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    with torch.no_grad():
        assert task.network() is task.net
    assert task.eval().network() is task.net
    assert not any("_orig_mod" in name for name in task.state_dict())
    plain = ImageClassificationTask(net=net)
    plain.configure_model()
    assert plain.train().network() is plain.net


def test_inductor_without_a_cpp_compiler_trains_eager_with_one_warning(monkeypatch, caplog) -> None:
    """model.compile=true on a CPU machine with no C++ compiler (inductor would fail at the first step): eager,
    with a warning that names what is missing; a compiler present: compiled."""
    import torch._inductor.config as inductor_config

    from zoo.tasks.base import missing_cpp_compiler
    from zoo.tasks.classification import ImageClassificationTask

    net = {"image_size": 8, "in_channels": 1, "num_classes": 10, "patch_size": 4, "dim": 16, "depth": 1,
           "num_heads": 2, "mlp_dim": 32}  # fmt: skip
    task = ImageClassificationTask(net=net, compile=True)
    task.configure_model()
    assert (task.network() is not task.net) is (missing_cpp_compiler() is None)  # compiled where g++ is found
    monkeypatch.setattr(inductor_config.cpp, "cxx", ("no-such-compiler-for-zoo",))
    task = ImageClassificationTask(net=net, compile=True)
    with caplog.at_level("WARNING", logger="zoo"):
        task.configure_model()
    assert task.network() is task.net and task.compile_backend is None
    assert "C++ compiler" in caplog.text and "training eager" in caplog.text


def test_a_compiled_run_and_an_older_compiled_checkpoint_load_for_test_and_as_pretrained(tmp_path, capsys) -> None:
    compiled = train([*VIT, *ONE_EPOCH, "model.compile=aot_eager"], tmp_path / "compiled", capsys)
    names = list(torch.load(compiled, weights_only=True)["state_dict"])
    assert names and not any("_orig_mod" in name for name in names)  # compiled in place: the plain names
    old = as_older_zoo_wrote_it(compiled, "vit")
    for checkpoint in (compiled, old):
        test_dir = tmp_path / f"test-{checkpoint.stem}"
        code, out, err = run_in_process(
            [*VIT, *QUIET, "train=false", f"ckpt_path={checkpoint}", f"hydra.run.dir={test_dir}"], capsys
        )
        assert code == 0, (out + err)[-3000:]
        assert "test/acc" in json.loads((test_dir / "metrics.json").read_text())
        run = tmp_path / f"pretrained-{checkpoint.stem}"
        train([*VIT, *ONE_EPOCH, f"model.pretrained={checkpoint}"], run, capsys)
        reloaded = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert reloaded["zoo"] == {"task": "zoo.tasks.classification.ImageClassificationTask", "family": "vit"}


def test_older_gpt_and_translation_checkpoints_generate_and_translate(tmp_path, capsys) -> None:
    gpt = as_older_zoo_wrote_it(train(GPT, tmp_path / "gpt", capsys), "gpt")
    code, out, err = run_in_process(["model=gpt", "mode=generate", f"ckpt_path={gpt}", "prompt=def", "max_new_tokens=5",
                                     *QUIET, f"hydra.run.dir={tmp_path / 'generate'}"], capsys)  # fmt: skip
    assert code == 0 and out.strip().splitlines()[-1].startswith("def"), (out + err)[-3000:]
    translation = as_older_zoo_wrote_it(train(TRANSLATION, tmp_path / "translation", capsys), "translation")
    code, out, err = run_in_process(["model=translation", "mode=translate", f"ckpt_path={translation}", "text=eins",
                                     *QUIET, f"hydra.run.dir={tmp_path / 'translate'}"], capsys)  # fmt: skip
    assert code == 0 and "eins\n  -> " in out, (out + err)[-3000:]
