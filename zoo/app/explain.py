"""`mode=explain`: an attribution method's map of each input image (the math: zoo/explain.py), as a heat-map PNG
and its raw scores (.npy, the patch grid) in <run dir>/explain/, and a table of what was explained (explain.csv).

ViT: the target is the predicted class. CLIP: the image tower against `caption=` (one caption), or else against
the class prompts (classes=, templates=, as mode=zero_shot) with the predicted zero-shot class as the target.
Sequence classifier: a pixel-sequence model (8-bit pixel tokens in raster order, unpermuted); each image is
read as grey pixels of the model's square side.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from zoo.data.captions import encode_captions, fill_templates
from zoo.data.preprocessing import ImagePreprocessing
from zoo.errors import UsageError, check_choice, check_positive_int
from zoo.explain import DEFAULT_STEPS, METHODS, attribute, subject_of
from zoo.export import family_of
from zoo.tasks.clip_evaluation import zero_shot_classifier
from zoo.training.attention_figures import attribution_figure

BATCH = 32  # images per attribution call: integrated gradients runs `steps` forward passes of each
DEFAULT_TEMPLATES = ("a photo of a {label}.",)


def chosen_method(cfg: DictConfig) -> str:
    method = cfg.get("method")
    if not method:
        raise UsageError(f"mode=explain needs method=<{' | '.join(METHODS)}>")
    check_choice("method", method, METHODS)
    return str(method)


def chosen_steps(cfg: DictConfig) -> int:
    """Integrated gradients' points on the path: `steps`, DEFAULT_STEPS when not given (0 is refused, not defaulted)."""
    steps = cfg.get("steps")
    steps = DEFAULT_STEPS if steps is None else steps
    check_positive_int("steps", steps)
    return steps


def pixel_preprocessing(model: nn.Module) -> ImagePreprocessing:
    """A pixel-sequence classifier's images: grey, side x side = max_length, raw 8-bit values as tokens."""
    config = model.config
    side = math.isqrt(config.max_length)
    if config.vocab_size != 256 or config.padding_id is not None or side * side != config.max_length:
        raise UsageError(
            f"mode=explain reads images as pixel sequences; this sequence classifier (vocab_size={config.vocab_size}, "
            f"max_length={config.max_length}) is not one: valid: model=vit | clip, or a pixel-sequence classifier"
        )
    return ImagePreprocessing(image_size=side, in_channels=1, mean=(0.0,), std=(1.0,))


def as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(item) for item in value]


def text_targets(cfg: DictConfig, model: nn.Module, preprocessing: ImagePreprocessing) -> tuple[torch.Tensor, list]:
    """CLIP: the text embeddings (K, E) to score images against, and their names."""
    if cfg.get("caption"):
        caption = str(cfg.caption)
        return model.encode_text(encode_captions(model.tokenizer, [caption])), [caption]
    classes = cfg.get("classes") or list(preprocessing.classes)
    if not classes:
        raise UsageError('mode=explain with a CLIP model needs caption="<text>" or classes=[<class name>,...]')
    classes = as_list(classes)
    templates = as_list(cfg.get("templates") or model.settings.get("templates") or DEFAULT_TEMPLATES)
    prompts = [encode_captions(model.tokenizer, row) for row in fill_templates(templates, classes)]
    return zero_shot_classifier(model, prompts), classes


@torch.no_grad()
def explain_files(
    cfg: DictConfig, model: nn.Module, files: list[Path], preprocessing: ImagePreprocessing | None, folder: Path
) -> dict[str, float]:
    """Attribute each image of `files` with cfg.method; PNG + .npy per image in `folder`, and explain.csv."""
    method, steps = chosen_method(cfg), chosen_steps(cfg)
    family = family_of(model)
    model.eval()
    if family == "sequence_classifier":
        preprocessing = pixel_preprocessing(model)
    text, names = None, None
    if family == "clip":
        text, names = text_targets(cfg, model, preprocessing)
    subject = subject_of(model, text)
    if names is None:
        classes = list(preprocessing.classes)
        count = model.config.num_classes
        names = classes if len(classes) == count else [str(i) for i in range(count)]
    # every image read before the folder exists: a file that is not one is refused with nothing written
    images = [preprocessing.read(file) for file in files]  # uint8 (C, H, W), at the model's size
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for start in range(0, len(files), BATCH):
        chunk = files[start : start + BATCH]
        pictures = torch.stack(images[start : start + BATCH])  # uint8 (B, C, H, W)
        if family == "sequence_classifier":
            inputs = pictures.flatten(1).long()  # (B, H * W) pixel tokens in raster order
        else:
            inputs = preprocessing.normalize(pictures)
        probabilities = subject.score(inputs).softmax(dim=-1)
        target = probabilities.argmax(dim=-1)
        scores = attribute(subject, inputs, method, target, steps=steps, seed=int(cfg.get("seed") or 0))
        side = math.isqrt(scores.shape[-1])  # the patch grid, or the pixel-sequence model's image side
        for file, picture, values, label, p in zip(chunk, pictures, scores, target.tolist(), probabilities):
            values = values.reshape(side, side)
            stem = f"{file.stem}_{method}"
            np.save(folder / f"{stem}.npy", values.numpy())
            title = f"{file.name}: {names[label]} ({float(p[label]):.2f}), {method}"
            attribution_figure(picture, values, method, title).savefig(folder / f"{stem}.png")
            top = divmod(int(values.argmax()), side)
            rows.append([str(file), method, names[label], f"{float(p[label]):.4f}", f"{top[0]},{top[1]}"])
    with (folder / "explain.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "method", "class", "probability", "top patch (row,col)"])
        writer.writerows(rows)
    detail = f", {steps} steps" if method == "integrated_gradients" else ""
    print(f"wrote {method}{detail} maps of {len(files)} images ({family}) to {folder}: <image>_{method}.png / .npy")
    return {}
