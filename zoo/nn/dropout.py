"""Dropout (Srivastava et al. 2014): zero each element with probability p, scale the rest by 1 / (1 - p).

F.dropout is the definition; on the CPU in training, the fast path (zoo/attention/fast/dropout.py, behind
the switch of zoo/attention/fast/) draws the same distribution's mask with NumPy, several times faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.fast import dropout as fast_dropout
from zoo.attention.fast import use_fast_kernels


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`: zero each element with probability p, scale the rest by 1 / (1 - p)."""
    if use_fast_kernels() and fast_dropout.applies(x, p, training):
        return fast_dropout.dropout(x, p)
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """`nn.Dropout` (same argument, state dict and repr) with `dropout`'s CPU fast path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
