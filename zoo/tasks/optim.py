"""Optimisers and learning-rate schedules shared by every task."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

SCHEDULES = ("cosine", "inverse_sqrt", "constant")
OPTIMIZERS = ("adamw", "adam")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices of Linear/Conv layers only; never biases, norms, embeddings or position tables
    (as GPT-2 / nanoGPT / timm do): decaying them only hurts."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue  # tied weights appear twice
            seen.add(id(param))
            is_matrix = name == "weight" and isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
            (decay if is_matrix else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(
    model: nn.Module,
    name: str = "adamw",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """Adam or AdamW; `fused` None picks the fused kernel wherever it runs (all parameters on one CPU or CUDA
    device), False the per-tensor (foreach) loop."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid choices: {list(OPTIMIZERS)}")
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    groups = (
        param_groups(model, weight_decay)
        if name == "adamw"
        else [{"params": [p for p in model.parameters() if p.requires_grad]}]
    )
    # The fused kernel updates every parameter in one pass: faster steps than the per-tensor loop on CPU
    # (experiments/results/recipes.md), and the usual choice on CUDA.
    if fused is None:
        devices = {p.device.type for p in model.parameters()}
        fused = devices <= {"cpu", "cuda"} and len(devices) == 1
    return cls(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused or None)


def lr_multiplier(
    name: str, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0, d_model: int | None = None
) -> Callable[[int], float]:
    """Step -> factor on the base lr.

    cosine: linear warmup, then cosine decay to min_lr_ratio at total_steps (nanoGPT's schedule).
    inverse_sqrt: linear warmup, then lr * sqrt(warmup / step) (Vaswani et al. 2017, eq. 3, with the
    peak at the configured lr rather than d_model^-0.5 * warmup^-0.5).
    constant: linear warmup, then flat.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {name!r}; valid choices: {list(SCHEDULES)}")
    warmup_steps = max(0, int(warmup_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if name == "constant":
            return 1.0
        if name == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
