"""zoo.load and exported folders: a checkpoint and an exported folder rebuild the same network (same outputs,
tokenizer, preprocessing, settings) without Lightning or Hydra; ONNX matches PyTorch within 1e-4 under
onnxruntime; the Hugging Face folder is GPT-2 with the same logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from tests.helpers import FAMILIES, ROOT, VARIANTS, as_checkpoint, tiny_model, variant_runs
from zoo.errors import CheckpointError, UsageError
from zoo.export import ONNX_FILE, export_huggingface, export_onnx, onnx_difference, save_folder, tied_weights


def outputs(model: torch.nn.Module) -> torch.Tensor:
    """The network's own forward on fixed inputs of its family."""
    generator = torch.Generator().manual_seed(1)
    family = model.config.family
    with torch.no_grad():
        if family == "vit":
            return model(torch.randn(3, 1, 8, 8, generator=generator))
        if family == "gpt":
            return model(torch.randint(0, model.config.vocab_size, (2, 16), generator=generator))
        if family == "translation":
            src = torch.randint(3, model.config.vocab_size, (2, 7), generator=generator)
            return model(src, torch.randint(3, model.config.vocab_size, (2, 5), generator=generator))
        if family == "sequence_classifier":  # with padding (id 0) at the end of the second sequence
            ids = torch.randint(1, model.config.vocab_size, (2, 15), generator=generator)
            ids[1, 10:] = model.config.padding_id
            return model(ids)
        if family == "bert":  # with padding at the end of the second sequence, and token types
            ids = torch.randint(7, model.config.vocab_size, (2, 16), generator=generator)
            ids[1, 11:] = model.config.padding_id
            return model(ids, token_type_ids=torch.randint(0, 2, (2, 16), generator=generator))
        images, texts = torch.randn(3, 1, 8, 8, generator=generator), torch.randint(3, 20, (2, 9), generator=generator)
        texts[:, -1] = model.config.text.eot_token_id
        return torch.cat([model.encode_image(images), model.encode_text(texts)])


def assert_same_model(loaded: torch.nn.Module, model: torch.nn.Module) -> None:
    assert type(loaded) is type(model) and not loaded.training
    assert loaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(outputs(loaded), outputs(model))
    assert (loaded.tokenizer is None) == (model.tokenizer is None)
    if model.tokenizer is not None:
        assert loaded.tokenizer.to_str() == model.tokenizer.to_str()
    assert loaded.preprocessing == model.preprocessing
    assert loaded.settings == model.settings


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_and_its_exported_folder_load_to_the_same_outputs(family: str, tmp_path: Path) -> None:
    model = tiny_model(family)
    checkpoint = as_checkpoint(model, tmp_path / "last.ckpt")
    from_checkpoint = zoo.load(checkpoint)
    assert_same_model(from_checkpoint, model)
    folder = save_folder(from_checkpoint, tmp_path / "export")
    config = json.loads((folder / "config.json").read_text())
    assert config["family"] == family and config["model"] == model.config.to_dict()
    assert (folder / "tokenizer.json").is_file() == (family in ("gpt", "translation", "clip", "bert"))
    assert (folder / "preprocessing.json").is_file() == (family in ("vit", "clip"))
    assert_same_model(zoo.load(folder), model)


ROUND_TRIPS = [(f, a) for f in FAMILIES for a in VARIANTS if a != "full" and variant_runs(f, a)]


@pytest.mark.parametrize(("family", "attention"), ROUND_TRIPS, ids=[f"{f}-{a}" for f, a in ROUND_TRIPS])
def test_every_variant_survives_checkpoint_and_folder(family: str, attention: str, tmp_path: Path) -> None:
    """Kernel parameters and buffers (compressed's per-head projections, FAVOR+'s features, T5's shared bias,
    grouped kv projections) travel with the weights."""
    model = tiny_model(family, attention)
    loaded = zoo.load(save_folder(zoo.load(as_checkpoint(model, tmp_path / "last.ckpt")), tmp_path / "export"))
    assert torch.equal(outputs(loaded), outputs(model))


def test_a_tied_weight_is_stored_once_and_stays_tied(tmp_path: Path) -> None:
    from safetensors import safe_open

    model = tiny_model("gpt")
    assert tied_weights(model) == {"lm_head.weight"}
    folder = save_folder(model, tmp_path / "gpt")
    with safe_open(str(folder / "model.safetensors"), "pt") as stored:
        names = set(stored.keys())
    assert "lm_head.weight" not in names and "wte.weight" in names
    loaded = zoo.load(folder)
    assert loaded.lm_head.weight is loaded.wte.weight


def test_device_moves_the_model(tmp_path: Path) -> None:
    folder = save_folder(tiny_model("vit"), tmp_path / "vit")
    assert next(zoo.load(folder).parameters()).device.type == "cpu"
    assert next(zoo.load(folder, device="meta").parameters()).device.type == "meta"


def test_loading_needs_neither_lightning_nor_hydra(tmp_path: Path) -> None:
    folder = save_folder(tiny_model("clip"), tmp_path / "clip")
    code = (
        "import sys, zoo; assert 'zoo.export' not in sys.modules; model = zoo.load(sys.argv[1]); "
        "print(type(model).__name__, sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', "
        "'pytorch_lightning', 'hydra', 'omegaconf') or m.startswith(('zoo.app', 'zoo.tasks', 'zoo.training'))))"
    )
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "CLIP []"


def test_what_is_no_model_gets_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="'nothing.ckpt' does not exist; valid: a checkpoint .* or a folder"):
        zoo.load("nothing.ckpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="without config.json"):
        zoo.load(tmp_path / "empty")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run folder of `python run.py`
    (tmp_path / "run" / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is a run folder, not a model; load its checkpoint: .*/last\.ckpt$"):
        zoo.load(tmp_path / "run")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(CheckpointError, match="Hugging Face GPT-2 folder.*from_pretrained"):
        zoo.load(tmp_path / "hf")
    torch.save({"state_dict": {}, "hyper_parameters": {}}, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match="not a checkpoint of a zoo model.*mode=export"):
        zoo.load(tmp_path / "other.ckpt")


# Every kernel path that tracing meets once: blockwise windows, linear, memory-compressed (data-dependent
# masks are taken unconditionally under torch.export), RoPE, a position bias with a sparse pattern, GQA.
ONNX_CASES = [
    ("vit", "local"),
    ("vit", "compressed"),
    ("gpt", "rope"),
    ("gpt", {"variant": "linear", "feature_map": "favor", "num_features": 16}),
    ("gpt", "gqa"),
    ("gpt", {"variant": "sparse", "stride": 2, "position_bias": "alibi"}),
    ("sequence_classifier", "axial"),
]


@pytest.mark.parametrize(("family", "attention"), ONNX_CASES, ids=lambda case: case if isinstance(case, str) else "")
def test_onnx_matches_pytorch_under_onnxruntime(family: str, attention, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = tiny_model(family, attention)
    path = export_onnx(model, tmp_path / ONNX_FILE)
    assert onnx_difference(model, path) <= 1e-4


@pytest.mark.parametrize("family", ["clip", "translation"])
def test_onnx_is_for_the_one_input_families(family: str, tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=f"format=onnx supports model=gpt \\| sequence_classifier \\| vit, not model={family}"
    ):
        export_onnx(tiny_model(family), tmp_path / ONNX_FILE)
    assert not (tmp_path / ONNX_FILE).exists()


def test_huggingface_folder_is_gpt2_with_the_same_logits_and_tokens(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_model("gpt")
    folder = export_huggingface(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    ids = torch.tensor([tokenizer("def f(x):")["input_ids"]])
    assert ids[0].tolist() == model.tokenizer.encode("def f(x):").ids
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


def test_huggingface_folder_of_bert_is_a_masked_lm_with_the_same_logits_and_tokens(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_model("bert")
    folder = export_huggingface(model, tmp_path / "hf")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    assert (tokenizer.mask_token, tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token) == (
        "[MASK]",
        "[CLS]",
        "[SEP]",
        "<pad>",
    )
    ids = torch.tensor([tokenizer("the [MASK]ox")["input_ids"]])
    assert ids[0].tolist() == model.tokenizer.encode("the [MASK]ox").ids
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
        again = zoo.load(folder)  # the transformers folder read back as a zoo BERT
        torch.testing.assert_close(again(ids), model(ids), atol=1e-5, rtol=1e-5)
    assert again.tokenizer.to_str() == model.tokenizer.to_str() or again.tokenizer.token_to_id("[MASK]") is not None


SUPPORTED = "supported: attention=full without rope, position_bias or kv_heads"


@pytest.mark.parametrize(("family", "attention", "message"), [
    ("gpt", "rope", f"format=huggingface: GPT-2 has full multi-head attention.*rope=True.*{SUPPORTED}"),
    ("gpt", "local", f"variant='local'.*{SUPPORTED}"),
    ("gpt", "alibi", f"position_bias='alibi'.*{SUPPORTED}"),
    ("gpt", "gqa", f"kv_heads=1.*{SUPPORTED}"),
    ("vit", "full", "format=huggingface writes GPT and BERT folders \\(model=gpt \\| bert\\), not model=vit; valid "
                    "formats for it: safetensors, onnx"),
    ("bert", "local", "format=huggingface: BERT and RoBERTa have none of: attention.variant='local' \\(valid: full\\); "
                      "supported: attention=full without rope"),
])  # fmt: skip
def test_huggingface_export_refuses_what_gpt2_is_not(family, attention, message, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(UsageError, match=message):
        export_huggingface(tiny_model(family, attention), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def tiny_llama(attention: dict | None = None, **fields) -> torch.nn.Module:
    """model=llama's blocks (RMSNorm, SwiGLU, RoPE, no biases, untied head), small and random, in eval mode."""
    from zoo.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    fields = {"norm": "rmsnorm", "mlp": "swiglu", "bias": False, "tie_weights": False, **fields}
    attention = {"rope": True, **(attention or {})}
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, attention=attention, **fields)
    return GPT(config).eval()


def gpt2_shaped(**fields) -> torch.nn.Module:
    """tiny_model("gpt") (LayerNorm, GELU MLP: exported as GPT-2) with `fields` changed."""
    from zoo.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig.from_dict({**tiny_model("gpt").config.to_dict(), **fields})).eval()


LLAMA_EXPORTS = {
    "llama": {},
    "gqa": {"kv_heads": 1},
    "mistral": {"variant": "local", "window": 4, "chunk_size": 2},
    "linear": {"rope_scaling": "linear", "rope_factor": 2.0},
    "dynamic": {"rope_scaling": "dynamic", "rope_factor": 2.0},
    "yarn": {"rope_scaling": "yarn", "rope_factor": 2.0},
    "llama3": {"rope_scaling": "llama3", "rope_factor": 2.0},  # zoo's defaults of low/high_freq_factor written out
}


@pytest.mark.parametrize("name", sorted(LLAMA_EXPORTS))
def test_huggingface_folder_of_llama_blocks_loads_in_transformers_with_the_same_logits(name, tmp_path) -> None:
    """Past the trained length too where RoPE is scaled (dynamic NTK changes its base there)."""
    transformers = pytest.importorskip("transformers")
    model = tiny_llama(LLAMA_EXPORTS[name])
    hf = transformers.AutoModelForCausalLM.from_pretrained(export_huggingface(model, tmp_path / "hf")).eval()
    length = 40 if model.config.attention.extrapolates else 16
    ids = torch.randint(0, 40, (2, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("model", "message"), [
    (lambda: tiny_llama({"variant": "local", "window": 4, "sink_tokens": 2}),
     "format=huggingface: no Llama / Qwen2 / Mistral has attention.sink_tokens=2 \\(Mistral's sliding window"),
    (lambda: tiny_llama({"variant": "local", "window": 4, "global_tokens": 2}),
     "format=huggingface: no Llama / Qwen2 / Mistral has attention.global_tokens=2 \\(Mistral's sliding window"),
    (lambda: tiny_llama({"rope_scaling": "ntk", "rope_factor": 2.0}),
     "format=huggingface: no Llama / Qwen2 / Mistral has attention.rope_scaling='ntk' .*valid: linear, dynamic, "
     "yarn, llama3"),
    (lambda: gpt2_shaped(qk_norm=True), "format=huggingface: GPT-2 .* this model has qk_norm=True"),
    (lambda: gpt2_shaped(qkv_bias=False), "format=huggingface: GPT-2 .* this model has qkv_bias=False"),
], ids=["sink_tokens", "global_tokens", "ntk", "qk_norm", "qkv_bias"])  # fmt: skip
def test_huggingface_export_refuses_what_the_folder_cannot_express(model, message, tmp_path: Path) -> None:
    """Each option that transformers' Llama / Qwen2 / Mistral / GPT-2 has no field for is one line naming it (before:
    a Mistral or GPT-2 folder with other logits, or a raw KeyError from transformers or the weight table)."""
    pytest.importorskip("transformers")
    with pytest.raises(UsageError, match=message):
        export_huggingface(model(), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
