"""Evaluating a CLIP model: zero-shot classification from prompt templates, image<->text retrieval, and a
picture of the similarity matrix (after OpenAI's CLIP notebook). Plain functions of embeddings: no Lightning.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from zoo.models.clip import CLIP


@torch.no_grad()
def zero_shot_classifier(model: CLIP, prompt_tokens: Sequence[torch.Tensor]) -> torch.Tensor:
    """Class embeddings (C, E) by prompt ensembling (Radford et al. 2021, section 3.1.4): the mean of the
    normalised embeddings of every template's prompt for the class, renormalised.

    prompt_tokens[t]: (C, T) token ids of template t filled with each of the C class names."""
    if not prompt_tokens:
        raise ValueError("zero-shot classification needs at least one prompt template")
    total = sum(model.encode_text(tokens) for tokens in prompt_tokens)
    return F.normalize(total, dim=-1)


def _ranks(similarity: torch.Tensor, relevant: torch.Tensor) -> torch.Tensor:
    """(Q, G) scores and (Q, G) bool relevance -> (Q,) 0-based rank of each query's best relevant item:
    how many irrelevant items score strictly higher (ties count in the query's favour)."""
    best = similarity.masked_fill(~relevant, float("-inf")).amax(dim=1, keepdim=True)
    return ((similarity > best) & ~relevant).sum(dim=1)


@torch.no_grad()
def retrieval_metrics(
    image_embeddings: torch.Tensor,
    text_embeddings: torch.Tensor,
    image_match_ids: torch.Tensor,
    text_match_ids: torch.Tensor,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
) -> dict[str, float]:
    """Recall@k and median rank (1-based) in both directions.

    A text is a correct answer for an image when their match ids agree (several correct answers are
    allowed, as for COCO's five captions per image); a query's rank is that of its best correct answer.
    Embeddings (N, E) and (M, E) are L2-normalised; match ids (N,) and (M,).
    """
    metrics: dict[str, float] = {}
    directions = {
        "image_to_text": (image_embeddings, text_embeddings, image_match_ids, text_match_ids),
        "text_to_image": (text_embeddings, image_embeddings, text_match_ids, image_match_ids),
    }
    for direction, (queries, gallery, query_ids, gallery_ids) in directions.items():
        ranks = torch.cat([
            _ranks(queries[start : start + chunk_size] @ gallery.T,
                   query_ids[start : start + chunk_size, None] == gallery_ids[None, :])
            for start in range(0, len(queries), chunk_size)
        ])  # fmt: skip
        for k in ks:
            metrics[f"{direction}_R@{k}"] = (ranks < k).float().mean().item()
        metrics[f"{direction}_median_rank"] = (ranks + 1).float().median().item()
    return metrics


def similarity_figure(images: torch.Tensor, captions: Sequence[str], similarity: torch.Tensor) -> Figure:
    """The cosine similarity of K images (columns, drawn above) and K captions (rows), values in the cells.

    images (K, C, H, W) in any range (each is min-max scaled for display); similarity (K captions, K images).
    """
    count = len(captions)
    figure = Figure(figsize=(2.0 + 0.9 * count, 1.5 + 0.55 * count), layout="constrained")
    axes = figure.add_subplot()
    values = similarity.detach().float().cpu()
    axes.imshow(values.numpy(), cmap="viridis", vmin=float(values.min()), vmax=float(values.max()))
    for row in range(values.shape[0]):
        for column in range(values.shape[1]):
            axes.text(column, row, f"{values[row, column]:.2f}", ha="center", va="center", fontsize=8, color="white")
    for column, image in enumerate(images.detach().float().cpu()):
        low, high = image.min(), image.max()
        image = ((image - low) / (high - low).clamp_min(1e-8)).permute(1, 2, 0)
        cmap = "gray" if image.shape[-1] == 1 else None
        axes.imshow(image.squeeze(-1).numpy(), cmap=cmap, extent=(column - 0.45, column + 0.45, -0.65, -1.55))
    axes.set_xlim(-0.5, values.shape[1] - 0.5)
    axes.set_ylim(values.shape[0] - 0.5, -1.6)
    axes.set_yticks(range(count), list(captions), fontsize=8)
    axes.set_xticks([])
    for side in ("left", "top", "right", "bottom"):
        axes.spines[side].set_visible(False)
    axes.set_title("cosine similarity of test images and their captions", fontsize=10)
    return figure
