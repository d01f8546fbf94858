"""Pictures of attention a person can read: an image's attention rollout overlaid on it, the class token's
attention per layer and head, and per-head token-to-token maps with the tokens on the axes. Every picture
has labelled axes and a colour bar. matplotlib Figures (no pyplot); log them with zoo.training.loggers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

ATTENTION_CMAP = "inferno"
SIGNED_CMAP = "coolwarm"


def _display(image: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """(C, H, W) in any range -> an array imshow draws (min-max scaled) and its colour map."""
    image = image.detach().float().cpu()
    low, high = image.min(), image.max()
    image = ((image - low) / (high - low).clamp_min(1e-8)).permute(1, 2, 0).numpy()
    return (image[..., 0], "gray") if image.shape[-1] == 1 else (image, None)


def rollout_figure(image: torch.Tensor, rollout: torch.Tensor, title: str = "") -> Figure:
    """The image, its attention rollout on the patch grid, and the rollout overlaid on the image.

    image (C, H, W); rollout (rows, cols): how much the prediction draws on each patch."""
    values = rollout.detach().float().cpu()
    picture, cmap = _display(image)
    height, width = picture.shape[:2]
    upsampled = F.interpolate(values[None, None], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
    figure = Figure(figsize=(11.0, 3.8), dpi=100, layout="constrained")
    left, middle, right = figure.subplots(1, 3)
    left.imshow(picture, cmap=cmap)
    left.set(title="input", xlabel="x (pixels)", ylabel="y (pixels)")
    shown = middle.imshow(values.numpy(), cmap=ATTENTION_CMAP, interpolation="nearest")
    middle.set(title="attention rollout", xlabel="patch column", ylabel="patch row")
    middle.set_xticks(range(values.shape[1]))
    middle.set_yticks(range(values.shape[0]))
    figure.colorbar(shown, ax=middle, fraction=0.046, pad=0.04, label="share of attention")
    right.imshow(picture, cmap=cmap)
    overlay = right.imshow(upsampled.numpy(), cmap=ATTENTION_CMAP, alpha=0.55)
    right.set(title="overlay", xlabel="x (pixels)", ylabel="y (pixels)")
    figure.colorbar(overlay, ax=right, fraction=0.046, pad=0.04, label="share of attention")
    if title:
        figure.suptitle(title)
    return figure


def grid_attention_figure(maps: torch.Tensor, title: str = "", query: str = "class token") -> Figure:
    """One panel per layer (rows) and head (columns): the attention of `query` over the patch grid.

    maps (layers, heads, rows, cols); one colour scale for all panels. Signed weights (memory-compressed
    attention's effective weights of the values) get a diverging scale centred on zero."""
    values = maps.detach().float().cpu()
    layers, heads = values.shape[:2]
    figure = Figure(figsize=(1.9 * heads + 1.4, 1.8 * layers + 0.9), dpi=100, layout="constrained")
    axes = np.asarray(figure.subplots(layers, heads, squeeze=False))
    signed = bool(values.min() < 0)
    vmax = float(values.abs().max()) or 1.0
    vmin, cmap, label = (
        (-vmax, SIGNED_CMAP, "effective weight") if signed else (0.0, ATTENTION_CMAP, "attention probability")
    )
    shown = None
    for layer in range(layers):
        for head in range(heads):
            panel = axes[layer, head]
            shown = panel.imshow(values[layer, head].numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
            panel.set_xticks([])
            panel.set_yticks([])
            if layer == 0:
                panel.set_title(f"head {head}", fontsize=9)
            if head == 0:
                panel.set_ylabel(f"layer {layer}\npatch row", fontsize=9)
            if layer == layers - 1:
                panel.set_xlabel("patch column", fontsize=9)
    figure.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label=label)
    figure.suptitle(title or f"attention of the {query} to each patch")
    return figure


def token_attention_figure(weights: torch.Tensor, tokens: Sequence[str], title: str = "") -> Figure:
    """One panel per head: the attention of every query token (rows) to every key token (columns), the
    tokens written on both axes. weights (heads, T, T); one colour scale for all heads."""
    values = weights.detach().float().cpu()
    heads, length = values.shape[0], values.shape[-1]
    if len(tokens) != length:
        raise ValueError(f"{len(tokens)} token labels for attention over {length} tokens")
    columns = min(heads, 4)
    rows = math.ceil(heads / columns)
    side = min(7.0, 1.2 + 0.28 * length)
    figure = Figure(figsize=(side * columns + 1.2, side * rows + 0.6), dpi=100, layout="constrained")
    axes = np.asarray(figure.subplots(rows, columns, squeeze=False))
    labels = [str(token) for token in tokens]
    shown = None
    for index, panel in enumerate(axes.ravel()):
        if index >= heads:
            panel.set_visible(False)
            continue
        shown = panel.imshow(values[index].numpy(), cmap=ATTENTION_CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
        panel.set_xticks(range(length), labels, rotation=90, fontsize=7)
        panel.set_yticks(range(length), labels, fontsize=7)
        panel.set(title=f"head {index}", xlabel="key (attended to)", ylabel="query")
    figure.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="attention probability")
    if title:
        figure.suptitle(title)
    return figure


def attribution_figure(image: torch.Tensor, scores: torch.Tensor, method: str, title: str = "") -> Figure:
    """The image, an attribution method's scores on the patch grid, and the scores overlaid (mode=explain).

    image (C, H, W); scores (rows, cols), higher = more evidence for the class. Signed scores (gradient
    methods) get a diverging scale centred on zero, so that evidence against the class reads as blue."""
    values = scores.detach().float().cpu()
    picture, cmap = _display(image)
    height, width = picture.shape[:2]
    upsampled = F.interpolate(values[None, None], size=(height, width), mode="nearest")[0, 0]
    signed = bool(values.min() < 0)
    vmax = float(values.abs().max()) or 1.0
    scale = dict(cmap=SIGNED_CMAP, vmin=-vmax, vmax=vmax) if signed else dict(cmap=ATTENTION_CMAP, vmin=0.0)
    figure = Figure(figsize=(11.0, 3.8), dpi=100, layout="constrained")
    left, middle, right = figure.subplots(1, 3)
    left.imshow(picture, cmap=cmap)
    left.set(title="input", xlabel="x (pixels)", ylabel="y (pixels)")
    shown = middle.imshow(values.numpy(), interpolation="nearest", **scale)
    middle.set(title=method, xlabel="patch column", ylabel="patch row")
    middle.set_xticks(range(values.shape[1]))
    middle.set_yticks(range(values.shape[0]))
    figure.colorbar(shown, ax=middle, fraction=0.046, pad=0.04, label="relevance")
    right.imshow(picture, cmap=cmap)
    overlay = right.imshow(upsampled.numpy(), alpha=0.55, **scale)
    right.set(title="overlay", xlabel="x (pixels)", ylabel="y (pixels)")
    figure.colorbar(overlay, ax=right, fraction=0.046, pad=0.04, label="relevance")
    if title:
        figure.suptitle(title)
    return figure
