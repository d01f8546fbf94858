"""The run modes of `python run.py mode=<name>`: one explicit table, name -> function(cfg) -> metrics.

train           fit, then test the best (or last) checkpoint                 every model (zoo.app.train)
generate        sample text from a GPT checkpoint                            model=gpt
translate       translate sentences with a translation checkpoint           model=translation | rnn_translation
predict         top-k classes of images; top-k tokens of a text's [MASK]s    model=vit | bert
zero_shot       probabilities of class names (prompt templates) per image   model=clip
retrieve        images for a text query, or captions for an image query     model=clip
attention_maps  attention of every family, as PNGs (and to the loggers)      vit, clip, gpt, (rnn_)translation
explain         attribution maps (attention, rollout, gradients) per image   vit, clip, sequence_classifier
export          a self-contained folder: safetensors | onnx | huggingface    every model (onnx: all but translation
                                                                             and clip; huggingface: gpt, bert)
shard           the data's train/val/test splits as litdata shards in out=   image, caption, text, parallel-text,
                                                                             token-sequence data

Every mode but train reads `ckpt_path=` (a checkpoint, or a folder written by mode=export) through zoo.load,
writes its results into the run directory and prints a short summary.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, ListConfig
from rich.console import Console
from rich.table import Table
from torch import nn

from zoo.app.explain import chosen_method, chosen_steps, explain_files
from zoo.app.hints import shown_path
from zoo.app.pipeline import instantiate_list
from zoo.app.train import train
from zoo.data.captions import encode_captions, fill_templates
from zoo.data.parallel_text import decode_ids, encode_sources, pad_sequences
from zoo.data.preprocessing import IMAGE_SUFFIXES, ImagePreprocessing, image_files
from zoo.data.shards import check_output_folder, write_shards
from zoo.data.tokenizers import encode_text
from zoo.errors import UsageError, check_choice, check_positive_int
from zoo.explain import EXPLAINABLE_FAMILIES
from zoo.export import (
    FAMILIES,
    ONNX_FILE,
    export_huggingface,
    export_onnx,
    family_of,
    load,
    onnx_difference,
    onnx_example,
    save_folder,
)
from zoo.models.gpt import SamplingConfig
from zoo.models.seq2seq import beam_search, greedy_decode
from zoo.models.vit import ViT, attention_rollout
from zoo.tasks.clip_evaluation import zero_shot_classifier
from zoo.tasks.language_model import generate_text
from zoo.tasks.masked_lm import fill_masks
from zoo.tasks.translation import alignment_figure, token_labels
from zoo.training.attention_figures import grid_attention_figure, rollout_figure, token_attention_figure
from zoo.training.checkpoints import task_class
from zoo.training.loggers import log_image

log = logging.getLogger("zoo")

EXPORT_FORMATS = ("safetensors", "onnx", "huggingface")
TRANSLATION_FAMILIES = ("translation", "rnn_translation")
ATTENTION_MAP_FAMILIES = ("vit", "clip", "gpt", *TRANSLATION_FAMILIES)
DEFAULT_TEMPLATES = ("a photo of a {label}.",)
BATCH = 256  # images per forward pass at inference


# -- shared pieces --------------------------------------------------------------------------------
def required(cfg: DictConfig, key: str, mode: str, example: str) -> Any:
    value = cfg.get(key)
    if value is None or value == "" or (isinstance(value, (list, ListConfig)) and not value):
        raise UsageError(f"mode={mode} needs {key}={example}")
    return value


def load_trained(cfg: DictConfig, mode: str, families: Sequence[str]) -> nn.Module:
    """The model at ckpt_path (a checkpoint or a folder written by mode=export), checked to be of a family
    `mode` serves and the one configured with model=."""
    path = required(cfg, "ckpt_path", mode, "<a checkpoint written by run.py, or a folder written by mode=export>")
    model = load(path)
    family = family_of(model)
    if family not in families:
        raise UsageError(f"mode={mode} is for model={' | '.join(families)}; ckpt_path={path!r} holds a {family} model")
    configured = getattr(task_class(cfg.model._target_), "family", None)
    if configured and configured != family:
        raise UsageError(f"ckpt_path={path!r} holds a {family} model, not a {configured} one; pass model={family}")
    return model


def image_preprocessing(cfg: DictConfig, model: nn.Module) -> ImagePreprocessing:
    """The checkpoint's image preprocessing; for checkpoints written before zoo stored it, the configured data's."""
    if model.preprocessing is not None:
        return model.preprocessing
    log.warning("the checkpoint carries no image preprocessing (older zoo): using the configured data's (data=...)")
    return hydra.utils.instantiate(cfg.data, _convert_="all").preprocessing()


def output_dir(cfg: DictConfig) -> Path:
    folder = Path(cfg.paths.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def top_k(cfg: DictConfig, available: int) -> int:
    k = cfg.get("top_k", 5)
    check_positive_int("top_k", k)
    return min(k, available)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console(width=160).print(table)


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)
    print(f"wrote {path}")


@torch.no_grad()
def encode_images(encode: Callable[[torch.Tensor], torch.Tensor], preprocessing: ImagePreprocessing, files) -> Any:
    """encode(images) of every file, in batches of BATCH images."""
    chunks = [files[start : start + BATCH] for start in range(0, len(files), BATCH)]
    return torch.cat([encode(preprocessing.load(chunk)) for chunk in chunks])


def ranked_rows(name: str, scores: torch.Tensor, labels: Sequence[str], k: int) -> list[list[Any]]:
    """[name, rank, label, score] for the k best of scores (N,)."""
    values, indices = scores.topk(k)
    return [
        [name, rank + 1, labels[i], f"{v:.4f}"] for rank, (v, i) in enumerate(zip(values.tolist(), indices.tolist()))
    ]


def class_names(preprocessing: ImagePreprocessing, count: int) -> list[str]:
    names = list(preprocessing.classes)
    return names if len(names) == count else [str(i) for i in range(count)]


# -- GPT and translation --------------------------------------------------------------------------
def generate(cfg: DictConfig) -> dict[str, float]:
    """`python run.py model=gpt mode=generate ckpt_path=... prompt="ROMEO:" max_new_tokens=300`: prints text."""
    model = load_trained(cfg, "generate", ("gpt",))
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.get("seed") is not None else None
    sampling = SamplingConfig(
        max_new_tokens=int(cfg.max_new_tokens), temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p
    )
    print(generate_text(model, model.tokenizer, str(cfg.prompt), sampling, generator=generator))
    return {}


def translations(cfg: DictConfig, mode: str, net: nn.Module) -> tuple[list[str], torch.Tensor, list[list[int]], int]:
    """(texts, padded source ids, translated ids, beam size) of `text` (a string or a list) by `net`."""
    text = required(cfg, "text", mode, '"<sentence to translate>"')
    texts = [text] if isinstance(text, str) else [str(t) for t in text]
    settings = net.settings
    beam_size = int(cfg.model.get("beam_size", settings.get("beam_size", 5)))
    length_penalty = float(cfg.model.get("length_penalty", settings.get("length_penalty", 1.0)))
    options = dict(max_len_a=settings.get("max_len_a", 1.2), max_len_b=settings.get("max_len_b", 10))
    src = pad_sequences(encode_sources(net.tokenizer, texts, net.config.max_length), net.config.pad_id)
    if beam_size == 1:
        outputs = greedy_decode(net, src, **options)
    else:
        outputs = beam_search(net, src, beam_size, length_penalty, **options)
    return texts, src, outputs, beam_size


def translate(cfg: DictConfig) -> dict[str, float]:
    """Translate `text` (a string or a list of strings) with the checkpoint at `ckpt_path`; prints each
    translation and saves the cross-attention alignment of the first as alignment.png in the run dir."""
    required(cfg, "text", "translate", '"<sentence to translate>"')
    net = load_trained(cfg, "translate", TRANSLATION_FAMILIES)
    texts, src, outputs, beam_size = translations(cfg, "translate", net)
    for source, ids in zip(texts, outputs):
        print(f"{source}\n  -> {decode_ids(net.tokenizer, ids)}")
    if cfg.get("paths", {}).get("output_dir"):
        source_ids = [i for i in src[0].tolist() if i != net.config.pad_id]
        figure = alignment_figure(net, net.tokenizer, source_ids, outputs[0], f"beam {beam_size}")
        if figure is not None:  # None: a model without attention (the fixed-vector RNN)
            figure.savefig(output_dir(cfg) / "alignment.png")
    return {}


# -- ViT ------------------------------------------------------------------------------------------
@torch.no_grad()
def predict(cfg: DictConfig) -> dict[str, float]:
    """`mode=predict inputs=<image | folder | glob>`: the top_k classes of each image with their probabilities,
    read exactly as the training run's evaluation read its images; a table and predictions.csv."""
    model = load_trained(cfg, "predict", ("vit", "bert"))
    if family_of(model) == "bert":
        return predict_masks(cfg, model)
    files = image_files(required(cfg, "inputs", "predict", "<an image file, a folder of images or a glob>"))
    preprocessing = image_preprocessing(cfg, model)
    names = class_names(preprocessing, model.config.num_classes)
    k = top_k(cfg, len(names))
    probabilities = encode_images(lambda images: model(images).softmax(dim=-1), preprocessing, files)
    rows = [row for file, p in zip(files, probabilities) for row in ranked_rows(str(file), p, names, k)]
    print_table(f"top-{k} classes of {len(files)} images", ["image", "rank", "class", "probability"], rows)
    write_csv(output_dir(cfg) / "predictions.csv", ["image", "rank", "class", "probability"], rows)
    return {}


# -- BERT -----------------------------------------------------------------------------------------
def predict_masks(cfg: DictConfig, model: nn.Module) -> dict[str, float]:
    """`mode=predict inputs="def [MASK](x):"` on a BERT: the top_k tokens of each [MASK] of each text with their
    probabilities, and the text filled with the most likely ones; a table and predictions.csv."""
    texts = as_list(required(cfg, "inputs", "predict", '"<a text with [MASK] in it>"'), "inputs")
    k = top_k(cfg, model.config.vocab_size)
    rows = []
    for text in texts:
        try:
            candidates = fill_masks(model, model.tokenizer, text, k)
        except ValueError as error:
            raise UsageError(f"inputs: {error}") from None
        filled = text
        for mask in candidates:
            filled = filled.replace("[MASK]", mask[0][0], 1)
        print(f"{text!r} -> {filled!r}")
        rows += [[text, n, rank, *readable([token]), f"{p:.4f}"]
                 for n, mask in enumerate(candidates) for rank, (token, p) in enumerate(mask, start=1)]  # fmt: skip
    columns = ["text", "mask", "rank", "token", "probability"]
    print_table(f"top-{k} tokens of each [MASK]", columns, rows)
    write_csv(output_dir(cfg) / "predictions.csv", columns, rows)
    return {}


# -- CLIP -----------------------------------------------------------------------------------------
def given(cfg: DictConfig, key: str, example: str) -> Any:
    """cfg[key], or None when it is not given (null); an explicit empty list or string is a mistake, not a
    request for the default."""
    value = cfg.get(key)
    if value is not None and (value == "" or (isinstance(value, (list, ListConfig)) and not value)):
        raise UsageError(f"{key}={'[]' if value != '' else repr(value)} is empty; give {key}={example} or leave it out")
    return value


def as_list(value: Any, key: str) -> list[str]:
    """A list from the command line (classes=[a,b]), or one string, or a text file with one item a line."""
    if isinstance(value, str):
        path = Path(value).expanduser()
        if path.is_file() and path.suffix.lower() in (".txt", ".csv", ""):
            return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [value]
    items = [str(item) for item in value]
    if not items:
        raise UsageError(f"{key} is empty")
    return items


@torch.no_grad()
def zero_shot(cfg: DictConfig) -> dict[str, float]:
    """`mode=zero_shot inputs=<images> classes=[...] [templates=[...]]`: the probability of each class per
    image, from prompt ensembling (Radford et al. 2021, section 3.1.4); a table and zero_shot.csv."""
    model = load_trained(cfg, "zero_shot", ("clip",))
    files = image_files(required(cfg, "inputs", "zero_shot", "<an image file, a folder of images or a glob>"))
    preprocessing = image_preprocessing(cfg, model)
    classes = given(cfg, "classes", "[<class name>,...]") or list(preprocessing.classes)
    if not classes:
        raise UsageError("mode=zero_shot needs classes=[<class name>,...] (this checkpoint has no class names)")
    classes = as_list(classes, "classes")
    templates = given(cfg, "templates", '["a photo of a {label}.",...]')
    templates = as_list(templates or model.settings.get("templates") or DEFAULT_TEMPLATES, "templates")
    prompts = [encode_captions(model.tokenizer, row) for row in fill_templates(templates, classes)]
    class_embeddings = zero_shot_classifier(model, prompts)
    image_embeddings = encode_images(model.encode_image, preprocessing, files)
    probabilities = (model.scale() * image_embeddings @ class_embeddings.T).softmax(dim=-1)
    k = top_k(cfg, len(classes))
    rows = [row for file, p in zip(files, probabilities) for row in ranked_rows(str(file), p, classes, k)]
    title = f"zero-shot top-{k} of {len(classes)} classes, {len(templates)} prompt templates"
    print_table(title, ["image", "rank", "class", "probability"], rows)
    write_csv(output_dir(cfg) / "zero_shot.csv", ["image", "rank", "class", "probability"], rows)
    return {}


@torch.no_grad()
def retrieve(cfg: DictConfig) -> dict[str, float]:
    """`mode=retrieve inputs=<image folder> query="..."`: the top_k images for a caption; with
    `query=<image file> captions=[...]` (or a text file, one caption a line): the top_k captions for an image.
    Scores are cosine similarities; a table and retrieval.csv."""
    model = load_trained(cfg, "retrieve", ("clip",))
    query = str(required(cfg, "query", "retrieve", '"<a caption>" (or an image file, with captions=[...])'))
    preprocessing = image_preprocessing(cfg, model)
    if given(cfg, "captions", "[<caption>,...] (or a text file, one caption a line)") is None and is_image(query):
        raise UsageError(
            f"mode=retrieve with an image query ({query}) needs captions=[<caption>,...] (or a text file, one "
            'caption a line) to rank; to find images for a caption, give query="<a caption>" inputs=<images>'
        )
    if cfg.get("captions") is not None:
        image = image_files(query, "query")
        captions = as_list(cfg.captions, "captions")
        gallery = model.encode_text(encode_captions(model.tokenizer, captions))
        queries = encode_images(model.encode_image, preprocessing, image[:1])
        labels, kind = captions, "captions"
    else:
        files = image_files(required(cfg, "inputs", "retrieve", "<a folder of images or a glob>"))
        gallery = encode_images(model.encode_image, preprocessing, files)
        queries = model.encode_text(encode_captions(model.tokenizer, [query]))
        labels, kind = [str(file) for file in files], "images"
    k = top_k(cfg, len(labels))
    rows = ranked_rows(query, (queries @ gallery.T)[0], labels, k)
    print_table(f"top-{k} of {len(labels)} {kind}", ["query", "rank", kind[:-1], "cosine similarity"], rows)
    write_csv(output_dir(cfg) / "retrieval.csv", ["query", "rank", kind[:-1], "score"], rows)
    return {}


def is_image(query: str) -> bool:
    """Whether a retrieve query names an image (a file name ending as images do) rather than a caption."""
    return Path(query).suffix.lower() in IMAGE_SUFFIXES


# -- attention maps -------------------------------------------------------------------------------
def image_attention_figures(
    vit: ViT, preprocessing: ImagePreprocessing, files: Sequence[Path], describe: Callable | None = None
) -> dict[str, Any]:
    """Per image: its attention rollout over the image, and the class token's attention (the mean over
    tokens, with mean pooling) per layer and head. `describe(images)` names what the model makes of it."""
    figures: dict[str, Any] = {}
    grid = vit.config.grid_size
    prefix = 1 if vit.config.pool == "cls" else 0
    for file in files:
        picture = preprocessing.read(file)
        images = preprocessing.normalize(picture)[None]
        weights = vit.attention_weights(images)  # per layer (1, H, N, N)
        rollout = attention_rollout(weights)[0]
        where = rollout[0, prefix:] if prefix else rollout.mean(dim=0)
        layers = torch.stack([w[0, :, 0, prefix:] if prefix else w[0].mean(dim=-2) for w in weights])
        query = "class token" if prefix else "mean over tokens"
        title = f"{file.name}" + (f": {describe(images)}" if describe else "")
        figures[f"{file.stem}_rollout"] = rollout_figure(picture, where.reshape(grid, grid), title)
        figures[f"{file.stem}_layers"] = grid_attention_figure(
            layers.reshape(len(weights), -1, grid, grid), f"{title} ({query}, per layer and head)", query
        )
    return figures


def readable(labels: list[str]) -> list[str]:
    return [label.replace("\n", "\\n").replace("\t", "\\t") or "␣" for label in labels]


def gpt_attention_figures(model: nn.Module, prompt: str) -> dict[str, Any]:
    """Per layer, every head's causal attention over the prompt's tokens."""
    ids = encode_text(model.tokenizer, prompt)
    if not ids or len(ids) > model.config.block_size:
        raise UsageError(
            f"prompt is {len(ids)} tokens long; mode=attention_maps needs 1 to block_size={model.config.block_size}"
        )
    labels = readable(token_labels(model.tokenizer, ids))
    weights = model.attention_weights(torch.tensor([ids]))
    return {
        f"layer{i}": token_attention_figure(w[0], labels, f"GPT layer {i}: attention over the prompt")
        for i, w in enumerate(weights)
    }


def describe_attention(attention: Any) -> str:
    """An AttentionConfig in words: 'sparse attention, alibi bias, 1 kv head(s)'."""
    words = [f"{attention.variant} attention"]
    if attention.rope:
        words.append("RoPE")
    if attention.position_bias is not None:
        words.append(f"{attention.position_bias} bias")
    if attention.kv_heads is not None:
        words.append(f"{attention.kv_heads} kv head(s)")
    return ", ".join(words)


def attention_maps(cfg: DictConfig) -> dict[str, float]:
    """`mode=attention_maps`: ViT and CLIP's image tower, attention rollout (Abnar & Zuidema 2020) and the
    class token's attention per layer and head for each of `inputs`; GPT, every head's map over `prompt`;
    translation, the cross-attention alignment of each `text`. PNGs in <run dir>/attention/, and to the
    loggers that show images (TensorBoard, W&B)."""
    model = load_trained(cfg, "attention_maps", ATTENTION_MAP_FAMILIES)
    family = family_of(model)
    if family in ("vit", "clip"):
        files = image_files(required(cfg, "inputs", "attention_maps", "<an image file, a folder of images or a glob>"))
        preprocessing = image_preprocessing(cfg, model)
        if family == "vit":
            names = class_names(preprocessing, model.config.num_classes)

            @torch.no_grad()
            def describe(images: torch.Tensor) -> str:
                p = model(images).softmax(dim=-1)[0]
                return f"{names[int(p.argmax())]} ({float(p.max()):.2f})"

            figures = image_attention_figures(model, preprocessing, files, describe)
        else:
            figures = image_attention_figures(model.image_encoder, preprocessing, files)
    elif family == "gpt":
        figures = gpt_attention_figures(model, str(required(cfg, "prompt", "attention_maps", '"<text>"')))
    else:
        if model.config.attention is None:
            raise UsageError(
                "mode=attention_maps: this RNN decodes from one fixed vector (model.net.attention=null) and has no "
                "attention to draw; valid: a model trained with attention=full | additive"
            )
        texts, src, outputs, _ = translations(cfg, "attention_maps", model)
        figures = {}
        for i, (source, ids) in enumerate(zip(src.tolist(), outputs)):
            source_ids = [token for token in source if token != model.config.pad_id]
            title = f"{texts[i]} -> {decode_ids(model.tokenizer, ids)}"
            figures[f"alignment{i}"] = alignment_figure(model, model.tokenizer, source_ids, ids, title)
    folder = output_dir(cfg) / "attention"
    loggers = instantiate_list(cfg.get("logger"))
    for name, figure in figures.items():
        log_image(loggers, f"attention/{name}", figure, save_path=folder / f"{name}.png")
    for logger in loggers:
        logger.finalize("success")
    shown = model.config.image.attention if family == "clip" else model.config.attention  # CLIP: the image tower's
    maps = f"{len(figures)} attention map{'s' if len(figures) != 1 else ''}"
    print(f"wrote {maps} of the {family} model ({describe_attention(shown)}) "
          f"to {shown_path(folder)}/: {', '.join(sorted(figures))}")  # fmt: skip
    return {}


def explain(cfg: DictConfig) -> dict[str, float]:
    """`mode=explain method=<zoo.explain.METHODS> inputs=<images>`: each image's attribution map, a PNG and its
    scores (.npy) in <run dir>/explain/ (zoo/app/explain.py; CLIP: against caption= or the class prompts)."""
    chosen_method(cfg), chosen_steps(cfg)
    model = load_trained(cfg, "explain", EXPLAINABLE_FAMILIES)
    files = image_files(required(cfg, "inputs", "explain", "<an image file, a folder of images or a glob>"))
    preprocessing = image_preprocessing(cfg, model) if family_of(model) in ("vit", "clip") else None
    return explain_files(cfg, model, files, preprocessing, output_dir(cfg) / "explain")


# -- export ---------------------------------------------------------------------------------------
def export(cfg: DictConfig) -> dict[str, float]:
    """`mode=export format=safetensors|onnx|huggingface`: <run dir>/export/, loadable without Hydra or
    Lightning (zoo.load; ONNX with onnxruntime; huggingface with transformers' GPT2LMHeadModel)."""
    model = load_trained(cfg, "export", tuple(FAMILIES))
    form = cfg.get("format", "safetensors")
    check_choice("format", form, EXPORT_FORMATS)
    folder = output_dir(cfg) / "export"
    if form == "huggingface":
        export_huggingface(model, folder)
        architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
        auto = "AutoModelForMaskedLM" if architecture.endswith("ForMaskedLM") else "AutoModelForCausalLM"
        print(f"exported a Hugging Face {architecture} folder to {shown_path(folder)}: "
              f"transformers.{auto}.from_pretrained(it)")  # fmt: skip
        return {}
    if form == "onnx":
        onnx_example(model)  # a family ONNX export does not serve fails here, before anything is written
    save_folder(model, folder)
    if form == "onnx":
        export_onnx(model, folder / ONNX_FILE)
        try:
            difference = f"largest difference to PyTorch {onnx_difference(model, folder / ONNX_FILE):.2e}"
        except ImportError:
            difference = "not checked: pip install onnxruntime"
        print(f"ONNX graph {shown_path(folder / ONNX_FILE)} (static shapes, onnxruntime: {difference})")
    files = ", ".join(sorted(p.name for p in folder.iterdir()))
    print(f"exported the {family_of(model)} model to {shown_path(folder)} ({files}); in Python: zoo.load(that folder)")
    return {}


# -- shard ----------------------------------------------------------------------------------------
def shard(cfg: DictConfig) -> dict[str, float]:
    """`mode=shard data=<data> out=<folder>`: the configured data module's splits as litdata shards in a new
    folder, read back by data=<kind>_stream (zoo/data/shards.py)."""
    out = required(cfg, "out", "shard", "<a new folder>")
    check_output_folder(out)  # before the data is read: nothing is overwritten
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    meta = write_shards(datamodule, out)
    counts = ", ".join(f"{split} {info['items']}" for split, info in meta["splits"].items())
    stream = {"tokens": "text", "images": "images", "captions": "captions"}.get(meta["kind"], meta["kind"])
    print(f"wrote {meta['kind']} shards to {shown_path(Path(out))} ({counts}); train on them with "
          f"data={stream}_stream data.data_dir={out}")  # fmt: skip
    return {}


# mode=<name> -> the function that runs it (cfg -> metrics); zoo.app.job.run_job around it seeds, reports, and turns
# bad input into one line.
MODES: dict[str, Callable[[DictConfig], dict[str, float]]] = {
    "train": train,
    "generate": generate,
    "translate": translate,
    "predict": predict,
    "zero_shot": zero_shot,
    "retrieve": retrieve,
    "attention_maps": attention_maps,
    "explain": explain,
    "export": export,
    "shard": shard,
}
