"""Dropout's CPU mask drawn by NumPy's PCG64 from one seed of torch's generator: the same distribution as
F.dropout's, several times faster.

The fast path of zoo/nn/dropout.py, whose reference is F.dropout. torch's CPU generator draws one
Mersenne-Twister number per element under a lock, so on the CPU `F.dropout` cost more than all the matmuls of
a small ViT step (figures in experiments/results/recipes.md). Here each call takes one 62-bit seed from torch's
generator (so `seed_everything`, resumed RNG states and per-rank seeds govern it exactly as they govern
`F.dropout`) and expands it with NumPy's PCG64 into 32 random bits per element: an element is dropped when its
bits fall below p * 2**32 (bool masks and bool-to-float casts are slow in torch, so the mask is built in NumPy
in x's dtype).
"""

from __future__ import annotations

import numpy as np
import torch

# 1.0 as each half type's bits: NumPy has no bfloat16, so the 0/1 mask is written as int16 and viewed.
_HALF_ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00}
_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


def applies(x: torch.Tensor, p: float, training: bool) -> bool:
    """Training with 0 < p < 1 on the CPU in a float type NumPy can write, outside compiled graphs (inductor
    has its own RNG)."""
    supported = x.dtype in _NUMPY_FLOATS or x.dtype in _HALF_ONE_BITS
    return training and 0.0 < p < 1.0 and x.device.type == "cpu" and supported and not torch.compiler.is_compiling()


def cpu_keep_mask(count: int, p: float) -> np.ndarray:
    """`count` booleans, each True (kept) with probability 1 - p, independently, drawn from torch's generator."""
    seed = int(torch.randint(0, 2**62, ()).item())
    bits = np.random.PCG64(seed).random_raw((count + 1) // 2).view(np.uint32)[:count]
    return bits >= np.uint32(min(round(p * 2**32), 2**32 - 1))  # P(keep) = 1 - p to within 2**-32


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """x * mask / (1 - p) with the mask from `cpu_keep_mask`, where `applies`."""
    keep, scale = cpu_keep_mask(x.numel(), p), 1.0 / (1.0 - p)
    if x.dtype in _NUMPY_FLOATS:
        mask = keep.astype(_NUMPY_FLOATS[x.dtype])
        mask *= scale  # folded into the mask: one multiply of x, the same numbers as F.dropout's x * mask * scale
        return x * torch.from_numpy(mask).view(x.shape)
    # bf16 / fp16: x * mask * 1/(1-p) in x's arithmetic, the scale unrounded (torch's bf16 kernel rounds it first)
    mask = keep.astype(np.int16)
    mask *= np.int16(_HALF_ONE_BITS[x.dtype])
    return x * torch.from_numpy(mask).view(x.dtype).view(x.shape) * scale
