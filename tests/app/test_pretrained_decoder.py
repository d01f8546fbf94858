"""The user's path with a Hugging Face checkpoint: `model=llama model.pretrained=<folder> data=text` fine-tunes
(with the folder's tokenizer), `mode=generate` samples from the result, `mode=export format=huggingface` writes
it back for transformers; tested on a tiny random checkpoint folder made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from tests.helpers import run_in_process, tiny_text
from tests.models.test_huggingface_decoders import tiny_checkpoint
from zoo.data.tokenizers import train_tokenizer

TRAIN = ["trainer.max_steps=2", "trainer.val_check_interval=2", "data.block_size=16", "data.batch_size=4",
         "data.eval_batches=1", "model.sample.max_new_tokens=4", "callbacks.rich_progress_bar=null",
         "callbacks.rich_model_summary=null", "logger=csv", "print_config=false", "test=false"]  # fmt: skip


def pretrained_folder(root: Path, corpus: Path, architecture: str = "llama") -> Path:
    """A random tiny checkpoint with a tokenizer.json of the corpus' characters (as a real folder has its own)."""
    tokenizer = train_tokenizer("char", [[corpus.read_text()]])
    tiny_checkpoint(root, architecture, vocab_size=tokenizer.get_vocab_size() + 3, max_position_embeddings=32)
    tokenizer.save(str(root / "tokenizer.json"))
    return root


def run(args: list[str], run_dir: Path, capsys) -> str:
    code, out, err = run_in_process([*args, f"hydra.run.dir={run_dir}", f"paths.data_dir={run_dir / 'data'}"], capsys)
    assert code == 0, (out + err)[-4000:]
    return out


@pytest.mark.parametrize("architecture", ["llama", "mistral"])
def test_fine_tune_a_pretrained_folder_then_generate_and_export(architecture, tmp_path, capsys) -> None:
    corpus = tiny_text(tmp_path / "corpus.txt")
    folder = pretrained_folder(tmp_path / "pretrained", corpus, architecture)
    base = zoo.load(folder)  # zoo.load reads a Hugging Face folder as well
    run(["model=llama", f"model.pretrained={folder}", "data=text", f"data.path={corpus}", *TRAIN],
        tmp_path / "train", capsys)  # fmt: skip
    checkpoint = tmp_path / "train" / "checkpoints" / "last.ckpt"
    tuned = zoo.load(checkpoint)
    assert tuned.config.to_dict() == base.config.to_dict()  # the checkpoint's architecture, not model=llama's
    assert tuned.tokenizer.to_str() == base.tokenizer.to_str()
    changed = [k for k, v in tuned.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed  # it trained
    out = run(["model=llama", "mode=generate", f"ckpt_path={checkpoint}", "prompt=ROMEO:", "max_new_tokens=8",
               "print_config=false"], tmp_path / "generate", capsys)  # fmt: skip
    assert "ROMEO:" in out
    run(["model=llama", "mode=export", "format=huggingface", f"ckpt_path={checkpoint}", "print_config=false"],
        tmp_path / "export", capsys)  # fmt: skip
    transformers = pytest.importorskip("transformers")
    exported = tmp_path / "export" / "export"
    name = json.loads((exported / "config.json").read_text())["architectures"][0]
    assert name == {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}[architecture]
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    ids = torch.tensor([tuned.tokenizer.encode("ROMEO: But").ids])
    with torch.no_grad():
        assert (hf(ids).logits - tuned(ids)).abs().max() < 1e-4


def test_lora_fine_tune_of_a_pretrained_folder_keeps_adapters_names_the_base_and_generates(tmp_path, capsys) -> None:
    corpus = tiny_text(tmp_path / "corpus.txt")
    folder = pretrained_folder(tmp_path / "pretrained", corpus)
    run(["model=llama", f"model.pretrained={folder}", "data=text", f"data.path={corpus}", "model.lora.rank=8",
         "model.optimizer.lr=0.05", *TRAIN], tmp_path / "train", capsys)  # fmt: skip
    path = tmp_path / "train" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["pretrained"] == str(folder.resolve())  # names its base
    assert checkpoint["state_dict"] and all("lora_" in key for key in checkpoint["state_dict"])  # adapters only
    base, tuned = zoo.load(folder), zoo.load(path)  # zoo.load: base + adapters, merged
    assert set(tuned.state_dict()) == set(base.state_dict())
    changed = {k for k, v in tuned.state_dict().items() if not torch.equal(v, base.state_dict()[k])}
    assert changed and all(k.endswith(("in_proj.weight", "out_proj.weight", "gate.weight", "fc1.weight",
                                       "fc2.weight")) for k in changed)  # fmt: skip
    out = run(["model=llama", "mode=generate", f"ckpt_path={path}", "prompt=ROMEO:", "max_new_tokens=8"],
              tmp_path / "generate", capsys)  # fmt: skip
    assert "ROMEO:" in out
    run(["model=llama", f"model.pretrained={folder}", "data=text", f"data.path={corpus}", "model.lora.rank=8",
         *TRAIN, "trainer.max_steps=3", f"ckpt_path={path}"], tmp_path / "train", capsys)  # fmt: skip
