"""Symmetric InfoNCE: the textbook formula, and across 2 gloo processes the same loss and gradients as one
process on the same global batch."""

from __future__ import annotations

import math
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from zoo.tasks.contrastive_loss import contrastive_loss

GLOBAL_BATCH, DIM, WORLD = 8, 6, 2


def global_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(GLOBAL_BATCH, DIM, generator=generator), dim=-1)
    texts = F.normalize(torch.randn(GLOBAL_BATCH, DIM, generator=generator), dim=-1)
    return images, texts, torch.tensor(1 / 0.07)


def test_loss_is_the_mean_of_both_cross_entropies() -> None:
    images, texts, scale = global_batch()
    logits = scale * images @ texts.T
    expected = 0.0
    for i in range(GLOBAL_BATCH):  # -log softmax of the diagonal, row-wise and column-wise
        expected += -torch.log_softmax(logits[i], 0)[i] / 2 - torch.log_softmax(logits[:, i], 0)[i] / 2
    torch.testing.assert_close(contrastive_loss(images, texts, scale), expected / GLOBAL_BATCH)
    # Swapping the modalities is the same loss; aligned pairs at a high scale cost almost nothing.
    torch.testing.assert_close(contrastive_loss(texts, images, scale), contrastive_loss(images, texts, scale))
    assert contrastive_loss(images, images, torch.tensor(100.0)) < 0.05
    assert math.isclose(contrastive_loss(images, texts, torch.tensor(0.0)).item(), math.log(GLOBAL_BATCH), rel_tol=1e-6)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_loss(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        images, texts, scale = global_batch()
        rows = slice(rank * GLOBAL_BATCH // WORLD, (rank + 1) * GLOBAL_BATCH // WORLD)
        local_images = images[rows].clone().requires_grad_()
        local_texts = texts[rows].clone().requires_grad_()
        scale = scale.clone().requires_grad_()
        loss = contrastive_loss(local_images, local_texts, scale)
        loss.backward()
        # What DDP does with the gradients of shared parameters: average them over the ranks.
        scale_grad = scale.grad.clone()
        dist.all_reduce(scale_grad)
        results[rank] = (loss.item(), local_images.grad, local_texts.grad, scale_grad / WORLD)
    finally:
        dist.destroy_process_group()


def test_distributed_loss_and_gradients_equal_the_single_process_ones() -> None:
    images, texts, scale = global_batch()
    images.requires_grad_(), texts.requires_grad_(), scale.requires_grad_()
    loss = contrastive_loss(images, texts, scale)
    loss.backward()

    results = mp.Manager().dict()
    mp.spawn(_rank_loss, args=(_free_port(), results), nprocs=WORLD, join=True)

    # The mean of the ranks' losses is the global loss ...
    assert math.isclose(sum(results[r][0] for r in range(WORLD)) / WORLD, loss.item(), rel_tol=1e-6)
    # ... and, after DDP's averaging, each rank's features get the global batch's gradient: all_gather passes
    # gradients back, so rank r's features sum the gradients of every rank's loss (hence x WORLD / WORLD).
    image_grads = torch.cat([results[r][1] for r in range(WORLD)]) / WORLD
    text_grads = torch.cat([results[r][2] for r in range(WORLD)]) / WORLD
    torch.testing.assert_close(image_grads, images.grad)
    torch.testing.assert_close(text_grads, texts.grad)
    torch.testing.assert_close(results[0][3], scale.grad)
