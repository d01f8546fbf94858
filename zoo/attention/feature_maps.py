"""Feature maps of linear attention: phi(q) . phi(k) stands in for the softmax kernel exp(q . k / sqrt(d)).

    elu    phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, eq. 7): positive, deterministic
    relu   phi(x) = max(x, 0): the simplest non-negative map (zero features give a zero output row)
    favor  FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers"): positive orthogonal
           random features whose inner product is an unbiased estimate of exp(q . k / sqrt(d)), so linear
           attention approximates softmax attention, the better the more features

FAVOR+ (their Lemma 1 and section 4.3): with x' = x / d^(1/4) and m random rows w_i,
phi(x)_i = exp(w_i . x' - |x'|^2 / 2) / sqrt(m), and E[phi(q) . phi(k)] = exp(q' . k') = exp(q . k / sqrt(d))
for w_i ~ N(0, I_d). Orthogonal rows (blocks of d from QR decompositions, each row rescaled to the norm of
a Gaussian vector) keep the estimate unbiased and lower its variance.
"""

from __future__ import annotations

import math

import torch

from zoo.attention.fast import linear as fast_linear
from zoo.attention.fast import use_fast_kernels

FEATURE_MAPS = ("elu", "relu", "favor")


def elu_feature_map(
    x: torch.Tensor, out: torch.Tensor | None = None, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020, eq. 7). Without autograd, `out` and `scratch`
    (contiguous, x's shape) may be given to write into (the fast path's long-sequence segments reuse them)."""
    if out is not None and torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("elu_feature_map writes into `out` only without autograd")
    if use_fast_kernels():
        return fast_linear.elu_plus_one(x, out, scratch)
    y = torch.exp(x.clamp(max=0.0)) + x.clamp(min=0.0)  # elu(x) + 1, without elu's cancellation of exp(x) - 1 + 1
    return y if out is None else out.copy_(y)


def relu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = max(x, 0)."""
    return torch.relu(x)


def default_num_features(head_dim: int) -> int:
    """Performer's default number of random features, d ln d (at least d)."""
    return max(head_dim, int(head_dim * math.log(head_dim)))


def orthogonal_random_features(
    num_features: int, dim: int, device: torch.device | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(num_features, dim) random rows w_i: orthogonal within each block of `dim` rows (QR of a Gaussian
    matrix), each rescaled to the norm of an independent N(0, I_dim) vector, so every row is marginally
    Gaussian (Choromanski et al. 2021, section 4.3). Drawn in float32 on the CPU (reproducible per seed).

    QR's Q is Haar-distributed (a uniformly random rotation) only with the signs fixed by R's diagonal
    (Mezzadri 2007): LAPACK makes diag(R) negative, so the raw Q's rows point to one side and the estimate of
    exp(q . k) is biased (tests/attention/test_favor_unbiased.py)."""
    blocks = []
    for _ in range(-(-num_features // dim)):
        gaussian = torch.randn(dim, dim, generator=generator)
        q, r = torch.linalg.qr(gaussian)
        blocks.append((q * torch.sign(torch.diagonal(r))).T)
    rows = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator).norm(dim=1, keepdim=True)
    return (rows * norms).to(device)


def favor_feature_map(x: torch.Tensor, projection: torch.Tensor, is_query: bool) -> torch.Tensor:
    """FAVOR+ positive random features of x (..., d) with projection (m, d) -> (..., m).

    The features are Lemma 1's, unscaled. A query row is scaled down only where its largest feature would pass a
    quarter of the dtype's exponent range (phi(q) . phi(k) summed over many keys must stay finite): linear
    attention's normaliser phi(q) . z has no additive eps, so the scale cancels between numerator and denominator.
    Keys are not stabilised: unscaled key features stay below their bound exp(|w_i|^2 / 2), which float32
    holds for any head_dim up to ~128 (|w_i|^2 ~ head_dim).
    """
    x = x * x.shape[-1] ** -0.25
    logits = x @ projection.to(x.dtype).T - (x * x).sum(-1, keepdim=True) / 2  # w_i . x' - |x'|^2 / 2
    if is_query:
        limit = math.log(torch.finfo(logits.dtype).max) / 4
        logits = logits - (logits.amax(dim=-1, keepdim=True).detach() - limit).clamp(min=0.0)
    return logits.exp() / math.sqrt(projection.shape[0])
