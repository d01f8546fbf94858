"""A trained model outside the training code: `load` a checkpoint or an exported folder as the pure nn.Module,
and write it out as a self-contained folder (`save_folder`), as ONNX (`export_onnx`) or as a Hugging Face
folder (`export_huggingface`: GPT-2 / Llama-family decoders, BERT / RoBERTa masked LMs). Pure torch +
safetensors + JSON: no Lightning, no Hydra.

An exported folder holds
    config.json          {"format": "zoo", "family": ..., "model": <the model config as a dict>, "settings": ...}
    model.safetensors    the network's weights (a tied weight stored once)
    tokenizer.json       text families: the Hugging Face `tokenizers` tokenizer
    preprocessing.json   image families: size, channels, mean, std, class names (zoo.data.preprocessing)
    model.onnx           format=onnx only (ViT, GPT, the sequence classifier; static shapes)

`load` returns the network in eval mode with three attributes: `tokenizer` (or None), `preprocessing` (an
ImagePreprocessing, or None) and `settings` (the task's inference options, e.g. translation's beam_size).
Weights are read through zoo.weights only (no code runs).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from copy import deepcopy as copy_module
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.data.preprocessing import ImagePreprocessing
from zoo.data.tokenizers import CLS, MASK, PAD, SEP, UNK, tokenizer_from_string
from zoo.errors import CheckpointError, UsageError
from zoo.models.bert import BERT, BERTConfig
from zoo.models.clip import CLIP, CLIPConfig
from zoo.models.gpt import GPT, GPTConfig
from zoo.models.rnn_translation import RNNTranslation, RNNTranslationConfig
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
from zoo.models.translation import TranslationConfig, TranslationTransformer
from zoo.models.vit import ViT, ViTConfig, vit_from_pretrained
from zoo.nn.lora import LoRAConfig, adapter_state_dict, add_lora, has_lora, merge_lora
from zoo.weights import checkpoint_identity, network_state_dict, read_checkpoint, read_weights

FAMILIES: dict[str, tuple[type[nn.Module], Any]] = {
    "vit": (ViT, ViTConfig),
    "gpt": (GPT, GPTConfig),
    "translation": (TranslationTransformer, TranslationConfig),
    "rnn_translation": (RNNTranslation, RNNTranslationConfig),
    "clip": (CLIP, CLIPConfig),
    "sequence_classifier": (SequenceClassifier, SequenceClassifierConfig),
    "bert": (BERT, BERTConfig),
}
# The base a LoRA checkpoint names (hparams `pretrained`), rebuilt as the family's task built it: (base, config).
PRETRAINED_BASES: dict[str, Any] = {
    "gpt": lambda base, config: GPT.from_huggingface(base, attention=config.attention.to_dict()),
    "vit": lambda base, config: vit_from_pretrained(base, config)[0],
    "clip": lambda base, config: CLIP.from_pretrained(base, attention=config.attention),
}
# Besides a family's sizes, the fields that make a LoRA checkpoint's base another network (a Llama base replaced
# by a Qwen2 of the same sizes).
ARCHITECTURE_FIELDS = {"gpt": ("norm", "mlp", "bias", "qkv_bias", "qk_norm", "tie_weights")}
ONNX_FAMILIES = ("gpt", "sequence_classifier", "vit")
HUGGINGFACE_FAMILIES = ("gpt", "bert")
# What each family's Hugging Face export writes, for the one-line refusal of what it cannot.
HUGGINGFACE_SUPPORTED = {
    "gpt": "attention=full without rope, position_bias or kv_heads (GPT-2), or model=llama's blocks with full or local "
    "attention (no sink or global tokens) and rope_scaling none, linear, dynamic, yarn or llama3 (Llama, Qwen2, "
    "Mistral)",
    "bert": "attention=full without rope, position_bias or kv_heads (BertForMaskedLM; RobertaForMaskedLM with "
    "position_ids=roberta)",
}
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
PREPROCESSING_FILE, ONNX_FILE = "preprocessing.json", "model.onnx"
FOLDER_FORMAT = "zoo"
# Task hyper-parameters that only training reads; the rest are inference settings (beam_size, ...).
TRAINING_ONLY = ("net", "optimizer", "scheduler", "compile", "pretrained", "lora")


# -- loading ------------------------------------------------------------------------------------------
def load(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The trained network of a zoo checkpoint or exported folder, in eval mode, with `.tokenizer`,
    `.preprocessing` and `.settings`.

    Args:
        path: a checkpoint (`outputs/<model>/<run>/checkpoints/*.ckpt`) or a folder written by `mode=export`.
        device: where the network's weights go.
    """
    source = Path(path).expanduser()
    if not source.exists():
        raise CheckpointError(
            f"{str(path)!r} does not exist; valid: a checkpoint (outputs/<model>/<run>/checkpoints/*.ckpt) or a "
            "folder written by mode=export"
        )
    model = _from_folder(source) if source.is_dir() else _from_checkpoint(source)
    return model.to(device).eval()


def family_of(model: nn.Module) -> str:
    """The family of a network from zoo.models: a key of FAMILIES."""
    family = getattr(getattr(model, "config", None), "family", None)
    if family not in FAMILIES:
        raise ValueError(
            f"not a zoo model: {type(model).__name__}; valid: {', '.join(c.__name__ for c, _ in FAMILIES.values())}"
        )
    return family


def _from_checkpoint(path: Path) -> nn.Module:
    checkpoint = read_checkpoint(path)
    task, family = checkpoint_identity(checkpoint)
    hparams = checkpoint.get("hyper_parameters") or {}
    if family not in FAMILIES or not isinstance(hparams.get("net"), dict):
        raise CheckpointError(
            f"ckpt_path={str(path)!r} is not a checkpoint of a zoo model (written by {task or 'an unknown task'}); "
            f"valid: one written by `python run.py model={'|'.join(FAMILIES)}`, or a folder written by mode=export"
        )
    settings = {key: value for key, value in hparams.items() if key not in TRAINING_ONLY}
    if "templates" in checkpoint:
        settings["templates"] = list(checkpoint["templates"])
    tokenizer = tokenizer_from_string(checkpoint["tokenizer"]) if "tokenizer" in checkpoint else None
    preprocessing = checkpoint.get("preprocessing")
    preprocessing = ImagePreprocessing.from_dict(preprocessing) if preprocessing else None
    state = network_state_dict(checkpoint["state_dict"])
    if (hparams.get("lora") or {}).get("rank"):
        model = _with_lora(family, hparams, state, str(path))
        model.tokenizer, model.preprocessing, model.settings = tokenizer, preprocessing, settings
        return model
    return _assemble(family, hparams["net"], state, tokenizer, preprocessing, settings, str(path))


def _with_lora(family: str, hparams: dict[str, Any], state: dict[str, torch.Tensor], where: str) -> nn.Module:
    """The network of a LoRA checkpoint, adapters merged: the base from the weights it names (hparams pretrained;
    the checkpoint then holds what trained only) or from the checkpoint itself, plus its adapters."""
    network, config_class = FAMILIES[family]
    config = config_class.from_dict(hparams["net"])
    base = hparams.get("pretrained")
    if base:
        if not Path(base).exists():
            raise CheckpointError(f"{where!r} holds LoRA adapters of the base {base!r}, which does not exist any more")
        model = PRETRAINED_BASES[family](base, config)
        fields = (*config.sizes, *ARCHITECTURE_FIELDS.get(family, ()))
        now, then = model.config.to_dict(), config.to_dict()
        changed = [name for name in fields if now.get(name) != then.get(name)]
        if changed:
            name = changed[0]
            raise CheckpointError(
                f"{where!r} holds LoRA adapters of the base {base!r}, which now holds another architecture "
                f"({name}={now.get(name)!r} there, {then.get(name)!r} when the adapters were trained); put the base "
                "they were trained on back in that folder"
            )
    else:
        model = network(config)
    add_lora(model, LoRAConfig(**hparams["lora"]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [key for key in missing if not base or adapter_state_dict({key: None})]  # the base's: from the base
    if missing or unexpected:
        raise CheckpointError(
            f"{where!r}: the LoRA weights do not fit the model (missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return merge_lora(model)


def _from_folder(folder: Path) -> nn.Module:
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        last = folder / "checkpoints" / "last.ckpt"
        if last.is_file():  # a run folder of `python run.py`
            raise CheckpointError(f"{str(folder)!r} is a run folder, not a model; load its checkpoint: {last}")
        raise CheckpointError(
            f"{str(folder)!r} is a folder without {CONFIG_FILE}; valid: a folder written by mode=export"
        )
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{config_file} is not valid JSON") from None
    if config.get("model_type") in ("llama", "qwen2", "mistral", "bert", "roberta"):
        return _from_huggingface_folder(folder, config["model_type"])
    if config.get("model_type") == "gpt2":
        raise CheckpointError(
            f"{str(folder)!r} is a Hugging Face GPT-2 folder: load it with transformers "
            "(GPT2LMHeadModel.from_pretrained), or zoo's GPT.from_huggingface on that model"
        )
    if config.get("format") != FOLDER_FORMAT or config.get("family") not in FAMILIES:
        raise CheckpointError(
            f"{config_file} does not describe a zoo model (format {config.get('format')!r}, family "
            f"{config.get('family')!r}); valid families: {', '.join(FAMILIES)}"
        )
    tokenizer = None
    if (folder / TOKENIZER_FILE).is_file():
        tokenizer = tokenizer_from_string((folder / TOKENIZER_FILE).read_text(encoding="utf-8"))
    preprocessing = None
    if (folder / PREPROCESSING_FILE).is_file():
        preprocessing = ImagePreprocessing.from_dict(json.loads((folder / PREPROCESSING_FILE).read_text()))
    state = read_weights(folder / WEIGHTS_FILE, "weights")
    return _assemble(
        config["family"], config["model"], state, tokenizer, preprocessing, config.get("settings", {}), str(folder)
    )


def _from_huggingface_folder(folder: Path, model_type: str) -> nn.Module:
    """A Llama / Qwen2 / Mistral folder of transformers' save_pretrained as a zoo GPT, a BERT / RoBERTa one as a zoo
    BERT, with its tokenizer.json."""
    model = BERT.from_huggingface(folder) if model_type in ("bert", "roberta") else GPT.from_huggingface(folder)
    tokenizer = None
    if (folder / TOKENIZER_FILE).is_file():
        tokenizer = tokenizer_from_string((folder / TOKENIZER_FILE).read_text(encoding="utf-8"))
    model.tokenizer, model.preprocessing, model.settings = tokenizer, None, {}
    return model


def _assemble(
    family: str,
    config: dict[str, Any],
    state: dict[str, torch.Tensor],
    tokenizer: Any,
    preprocessing: ImagePreprocessing | None,
    settings: dict[str, Any],
    where: str,
) -> nn.Module:
    """The network of `family` built from its config dict, its weights loaded (a tied weight may be stored
    once), the tokenizer, preprocessing and inference settings attached."""
    network, config_class = FAMILIES[family]
    model = network(config_class.from_dict(config))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [key for key in missing if key not in tied_weights(model)]
    if missing or unexpected:
        raise CheckpointError(
            f"{where!r}: the weights do not fit the {family} model its config describes "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    model.tokenizer, model.preprocessing, model.settings = tokenizer, preprocessing, dict(settings)
    return model


def tied_weights(model: nn.Module) -> set[str]:
    """State-dict keys that share their storage with an earlier key (GPT's LM head is its token table)."""
    seen, tied = set(), set()
    for key, tensor in model.state_dict().items():
        if tensor.numel() == 0:
            continue
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            tied.add(key)
        seen.add(pointer)
    return tied


# -- writing ------------------------------------------------------------------------------------------
def save_folder(model: nn.Module, folder: str | Path) -> Path:
    """A self-contained folder that `load` (or any safetensors + JSON reader) rebuilds `model` from.

    Args:
        model: a network of zoo.models (LoRA adapters are merged into the weights first).
        folder: where config.json, model.safetensors and the tokenizer or preprocessing files are written.
    """
    from safetensors.torch import save_file

    family = family_of(model)
    model = merged(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tied = tied_weights(model)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "family": family})
    config = {
        "format": FOLDER_FORMAT,
        "family": family,
        "model": model.config.to_dict(),
        "settings": getattr(model, "settings", None) or {},
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if getattr(model, "tokenizer", None) is not None:
        (folder / TOKENIZER_FILE).write_text(model.tokenizer.to_str(), encoding="utf-8")
    if getattr(model, "preprocessing", None) is not None:
        (folder / PREPROCESSING_FILE).write_text(json.dumps(model.preprocessing.to_dict(), indent=2) + "\n")
    return folder


def merged(model: nn.Module) -> nn.Module:
    """`model` itself, or a copy with its LoRA adapters merged into the weights (what exports write)."""
    if not has_lora(model):
        return model
    copy = merge_lora(copy_module(model))
    for name in ("tokenizer", "preprocessing", "settings"):
        setattr(copy, name, getattr(model, name, None))
    return copy


def onnx_example(model: nn.Module) -> tuple[str, torch.Tensor]:
    """The input name and a fixed-shape example input of the ONNX graph: images (1, C, H, W) for a ViT,
    token ids (1, block_size) for a GPT, (1, max_length) for the sequence classifier."""
    family = family_of(model)
    generator = torch.Generator().manual_seed(0)
    if family == "vit":
        size, channels = model.config.image_size, model.config.in_channels
        return "images", torch.randn(1, channels, size, size, generator=generator)
    if family == "gpt":
        shape = (1, model.config.block_size)
        return "input_ids", torch.randint(0, model.config.vocab_size, shape, generator=generator)
    if family == "sequence_classifier":
        shape = (1, model.config.max_length)
        return "input_ids", torch.randint(0, model.config.vocab_size, shape, generator=generator)
    raise UsageError(f"format=onnx supports model={' | '.join(ONNX_FAMILIES)}, not model={family}")


def export_onnx(model: nn.Module, path: str | Path) -> Path:
    """The network as an ONNX graph of static shapes (`onnx_example`), output `logits`, via torch.export.

    Args:
        model: a ViT, GPT or sequence classifier of zoo.models.
        path: the .onnx file to write.
    """
    name, example = onnx_example(model)
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401  (torch.onnx's exporter is written in it)
    except ImportError:
        raise UsageError("format=onnx needs the onnx and onnxscript packages: pip install -e '.[test]'") from None
    model = model.eval()
    with torch.no_grad():
        model(example)  # warm-up: local attention caches its block mask, which must not be created while tracing
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > 1 << 30
    with _quiet_exporter(), torch.no_grad():
        torch.onnx.export(
            model, (example,), str(path), dynamo=True, input_names=[name], output_names=["logits"],
            external_data=large, verbose=False,
        )  # fmt: skip
    return Path(path)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """torch.onnx narrates every step on stdout and its passes log at INFO: keep the console for zoo's summary."""
    loggers = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def onnx_difference(model: nn.Module, path: str | Path) -> float:
    """The largest absolute difference between onnxruntime's outputs for the ONNX graph at `path` and the
    network's own, on the example input."""
    import onnxruntime

    name, example = onnx_example(model)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(["logits"], {name: example.numpy()})
    with torch.no_grad():
        reference = model(example)
    return float((torch.from_numpy(output) - reference).abs().max())


def export_huggingface(model: nn.Module, folder: str | Path) -> Path:
    """A GPT or BERT as a `transformers` folder (save_pretrained: config.json, model.safetensors, and the tokenizer as
    a PreTrainedTokenizerFast): GPT-2 (full attention, learned positions), or Llama / Qwen2 / Mistral for the Llama
    family's blocks (GPT.to_huggingface); BertForMaskedLM or RobertaForMaskedLM (BERT.to_huggingface). LoRA adapters
    are merged into the weights first.

    Args:
        model: a GPT or BERT of zoo.models.
        folder: where the transformers folder is written.
    """
    family = family_of(model)
    if family not in HUGGINGFACE_FAMILIES:
        raise UsageError(f"format=huggingface writes GPT and BERT folders (model=gpt | bert), not model={family}; "
                         f"valid formats for it: safetensors{', onnx' if family in ONNX_FAMILIES else ''}")  # fmt: skip
    model = merged(model)
    try:
        hf_model = model.to_huggingface()
    except ValueError as error:
        raise UsageError(f"format=huggingface: {error}; supported: {HUGGINGFACE_SUPPORTED[family]}") from None
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    hf_model.save_pretrained(folder)
    if getattr(model, "tokenizer", None) is not None:
        # BERT's tokens named as transformers' fill-mask pipeline and data collators look them up.
        roles = {"mask_token": MASK, "cls_token": CLS, "sep_token": SEP, "pad_token": PAD, "unk_token": UNK}
        named = {role: token for role, token in roles.items() if model.tokenizer.token_to_id(token) is not None}
        PreTrainedTokenizerFast(
            tokenizer_object=model.tokenizer, **(named if family == "bert" else {})
        ).save_pretrained(folder)
    return folder
