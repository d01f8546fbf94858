"""Shared references for the attention tests: the textbook O(n^2) formulas, written out plainly."""

from __future__ import annotations

import math

import torch


def reference_softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v under a bool mask (True = may attend); rows with no key give zeros.
    k and v with fewer heads than q are repeated (head h uses key/value head h // (H / G))."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if allowed is not None:
        probs = probs.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return probs @ v


def banded_mask(length: int, window: int, causal: bool) -> torch.Tensor:
    """(n, n) True where key j is within the window of query i, built with explicit loops."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            allowed[i, j] = (0 <= i - j < window) if causal else abs(i - j) <= window // 2
    return allowed


def reference_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Katharopoulos et al. 2020, eq. 4 with phi = elu + 1, as an explicit sum over keys (eps 1e-6)."""
    phi_q = torch.nn.functional.elu(q) + 1
    phi_k = torch.nn.functional.elu(k) + 1
    similarity = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    if causal:
        similarity = similarity * torch.ones(q.shape[2], k.shape[2]).tril()
    if key_padding_mask is not None:
        similarity = similarity * (~key_padding_mask)[:, None, None, :]
    return (similarity @ v) / (similarity.sum(dim=-1, keepdim=True) + 1e-6)


def random_padding(batch: int, length: int, generator: torch.Generator, left: bool = False) -> torch.Tensor:
    """(B, n) bool padding with at least one real token per row; left=True pads the start (generation)."""
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    lengths[0] = length
    positions = torch.arange(length)[None]
    if left:
        return positions < (length - lengths)[:, None]
    return positions >= lengths[:, None]
