"""Optimisers (zoo/tasks/optim.py): the fused kernel by default, the per-tensor loop on request."""

from __future__ import annotations

import pytest
import torch

from zoo.tasks.optim import build_optimizer


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_optimizers_are_fused_by_default_and_unfused_when_asked(name: str) -> None:
    model = torch.nn.Linear(4, 4)
    assert build_optimizer(model, name).defaults["fused"] is True
    assert not build_optimizer(model, name, fused=False).defaults["fused"]
