"""Shared references for the attention tests: the textbook O(n^2) formulas, written out plainly."""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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


def sparse_mask(length: int, pattern: str, stride: int, summary: int, causal: bool) -> torch.Tensor:
    """(n, n) True where the Sparse Transformer's pattern lets query i see key j (Child et al. 2019, 4.2),
    with explicit loops: strided = the previous `stride` positions or every stride-th one, fixed = the same
    block of `stride` or the last `summary` positions of a block; bidirectional strided is mirrored."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            if causal and j > i:
                continue
            if pattern == "strided":
                allowed[i, j] = abs(i - j) < stride or (i - j) % stride == 0
            else:
                allowed[i, j] = i // stride == j // stride or j % stride >= stride - summary
    return allowed


def axial_mask(length: int, width: int, prefix: int, causal: bool) -> torch.Tensor:
    """(n, n) True where query i sees key j in axial attention, with explicit loops: the tokens after
    `prefix` laid out in rows of `width`, each seeing its row and its column; prefix tokens are global."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            if causal and j > i:
                continue
            if i < prefix or j < prefix:
                allowed[i, j] = True
            else:
                (row_i, col_i), (row_j, col_j) = divmod(i - prefix, width), divmod(j - prefix, width)
                allowed[i, j] = row_i == row_j or col_i == col_j
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


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (elements) any aten op allocates, forward and backward: views of its inputs and
    results written into them (in-place, out=) allocate nothing and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = torch.utils._pytree.tree_leaves((args, kwargs))
        storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor) and item.untyped_storage().data_ptr() not in storages:
                self.largest = max(self.largest, item.numel())
        return result


def use_blockwise_path(monkeypatch, fused: bool) -> None:
    """Make the pattern kernels (sparse, axial) take their blockwise path at every length, fused (the
    CPU flash kernel) or explicit (the formula under autograd)."""
    from zoo.attention import pattern
    from zoo.attention.fast import blocks

    monkeypatch.setattr(pattern, "DENSE_MAX_LENGTH", 0)
    monkeypatch.setattr(blocks, "fused_kernel_applies", lambda *args: fused)


def assert_kernel_matches_masked_attention(kernel, allowed: torch.Tensor, causal: bool, padded: bool, seed: int):
    """kernel(q, k, v) (B=2, H=2, head dim 8) equals the textbook formula under `allowed` (n, n) and random
    padding (left padding when causal, as in generation), in outputs and in the gradients of q, k and v
    (fp32, 1e-5)."""
    length = allowed.shape[0]
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=True) for _ in range(3))
    padding = random_padding(2, length, generator, left=causal) if padded else None
    mask = allowed[None, None]
    if padding is not None:
        mask = mask & ~padding[:, None, None, :]
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    expected = reference_softmax_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def largest_tensor(kernel, length: int, causal: bool) -> int:
    """The most elements of any tensor made by kernel(q, k, v) and its backward (B=1, H=1, head dim 8, the
    first 5 keys padded)."""
    q, k, v = (torch.randn(1, 1, length, 8, requires_grad=True) for _ in range(3))
    padding = torch.zeros(1, length, dtype=torch.bool)
    padding[0, :5] = True
    with LargestTensor() as spy:
        out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
        out.sum().backward()
    return spy.largest
