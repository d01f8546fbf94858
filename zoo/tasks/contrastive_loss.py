"""Symmetric InfoNCE, CLIP's contrastive loss (Radford et al. 2021, figure 3; van den Oord et al. 2018).

Image i and text i are a positive pair; every other text (image) of the global batch is a negative. Across
processes the features of all ranks are gathered *with* gradients, and each rank scores its own rows
against the global batch (open_clip's "local loss"): the mean of the ranks' losses is the loss of the
global batch, and after DDP averages the gradients every rank holds the global batch's gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def gather_with_gradients(features: torch.Tensor) -> torch.Tensor:
    """(B, E) on each rank -> (world * B, E) in rank order; gradients flow back to every rank's slice.

    Ranks must hold batches of the same size (all_gather's contract)."""
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(features), dim=0)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def contrastive_loss(
    image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor
) -> torch.Tensor:
    """Mean of image->text and text->image cross-entropy over this rank's rows of the global batch.

    image_features, text_features: (B, E) L2-normalised, row i of each a positive pair;
    logit_scale: exp(learned temperature), a scalar.
    """
    if image_features.shape != text_features.shape:
        raise ValueError(
            f"image and text features must pair up row by row, got {tuple(image_features.shape)} and "
            f"{tuple(text_features.shape)}"
        )
    all_images, all_texts, offset = image_features, text_features, 0
    if is_distributed():
        all_images, all_texts = gather_with_gradients(image_features), gather_with_gradients(text_features)
        offset = dist.get_rank() * image_features.shape[0]  # this rank's rows inside the global batch
    logits_per_image = logit_scale * image_features @ all_texts.T  # (B, world * B)
    logits_per_text = logit_scale * text_features @ all_images.T  # (B, world * B)
    labels = torch.arange(image_features.shape[0], device=image_features.device) + offset
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
