"""Linear attention's CPU fast paths: long causal sequences a segment at a time with reused scratch tensors, the
exclusive prefix sum as a loop of row additions (`_ExclusivePrefixSum`), elu + 1 through exp2 with its own
backward (`_EluPlusOne`), and bidirectional FAVOR+ as one function with its own backward (`_FavorBidirectional`).

The fast path of zoo/attention/linear.py and feature_maps.py, which hold the same function in public torch ops
(one chunked pass, cumsum, F.elu(x) + 1); both are checked in tests/attention/test_linear_attention.py under both
settings of the switch. Re-measure with `experiments/attention_benchmark.py --rows linear linear-kernel`
(figures in experiments/results/recipes.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

LOG2_E = 1.0 / math.log(2.0)
# Tokens per segment of a long causal sequence: the feature maps and the chunked kernel run a segment at a time,
# carrying the state [S | z] from one to the next (the recurrence of decoding), so that the working set of each
# step stays in cache and the time per token does not grow with n (faster at 32768 tokens; shorter segments were
# no better).
SEGMENT_LENGTH = 2048
# Prefix sums over rows at least this wide take the loop of row additions on the CPU (narrower ones, such as z's
# of head-dim width, stay with cumsum).
SCAN_MIN_WIDTH = 1024


def scratch(workspace: dict | None, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
    """A scratch tensor of `shape` that the segments of one long causal call without autograd reuse (on the CPU
    every large fresh tensor costs page faults, and they were the main source of the forward's run-to-run
    spread); None without a workspace (allocate as usual)."""
    if workspace is None:
        return None
    buffer = workspace.get(name)
    if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype:
        buffer = workspace[name] = like.new_empty(shape)
    return buffer


def causal_segments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    chunk: int,
    features: Callable,
    attend: Callable,
) -> torch.Tensor:
    """Causal linear attention SEGMENT_LENGTH tokens at a time, each segment continuing the state of the last:
    `features(q, k, v, key_padding_mask, workspace=)` -> (phi_q, phi_k, values) and `attend(phi_q, phi_k, values,
    state=, out=, workspace=)` -> (out, state) (linear.py's `_features` and normalised `causal_linear_attention`).
    Split, not sliced: the backward then joins the segments' gradients in one copy instead of one full-size zero
    tensor per segment. Without autograd each segment of whole chunks is written into its part of the output
    (no joining copy), and the segments share their scratch tensors (`scratch`)."""
    segment = max(chunk, SEGMENT_LENGTH // chunk * chunk)  # whole chunks: the same chunks as one pass
    pieces = [x.split(segment, dim=2) for x in (q, k, v)]
    masks = key_padding_mask.split(segment, dim=1) if key_padding_mask is not None else [None] * len(pieces[0])
    direct = len(pieces[0]) > 1 and not torch.is_grad_enabled()
    joined = q.new_empty(q.shape[:3] + v.shape[-1:]) if direct else None
    workspace = {} if direct else None
    outs, state, start = [], None, 0
    for q_part, k_part, v_part, padding in zip(*pieces, masks):
        phi_q, phi_k, values = features(q_part, k_part, v_part, padding, workspace=workspace)
        end = start + q_part.shape[2]
        whole = direct and q_part.shape[2] % chunk == 0
        target = joined[:, :, start:end] if whole else None
        out, state = attend(phi_q, phi_k, values, state=state, out=target, workspace=workspace)
        if direct and not whole:  # the last segment's partial chunk: computed apart, then copied in
            joined[:, :, start:end] = out
        elif not direct:
            outs.append(out)
        start = end
    if direct:
        return joined
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def scan_applies(x: torch.Tensor) -> bool:
    """The loop of row additions: wide rows on the CPU."""
    return x.device.type == "cpu" and x.shape[-1] >= SCAN_MIN_WIDTH


def exclusive_prefix_sum(
    x: torch.Tensor, initial: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """linear.exclusive_prefix_sum as a loop of row additions (written into `out`, x's shape, if given, without
    autograd)."""
    if out is not None and not torch.is_grad_enabled():
        return _exclusive_scan(x, initial, out)
    return _ExclusivePrefixSum.apply(x, initial)


class _ExclusivePrefixSum(torch.autograd.Function):
    """Sums over all earlier chunks, starting from `initial`: (N, nc, F), (N, F) -> (N, nc, F), out_0 = initial,
    out_c = out_(c-1) + x_(c-1): one add per chunk written straight into its row (on the CPU torch.cumsum along
    the middle dimension is a strided scalar scan, several times slower, and its backward flips the gradient
    twice). The backward is the same recurrence from the other end."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, initial: torch.Tensor | None) -> torch.Tensor:
        ctx.has_initial = initial is not None
        return _exclusive_scan(x, initial, torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # d out_c / d x_j = 1 for every c > j: grad_x_j = grad_x_(j+1) + grad_(j+1), and initial feeds every row.
        grad = grad.contiguous()
        grad_x = torch.empty_like(grad)
        grad_x[:, -1].zero_()
        for index in reversed(range(grad.shape[1] - 1)):
            torch.add(grad_x[:, index + 1], grad[:, index + 1], out=grad_x[:, index])
        return grad_x, (grad_x[:, 0] + grad[:, 0]) if ctx.has_initial else None


def _exclusive_scan(x: torch.Tensor, initial: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    if initial is None:
        out[:, 0].zero_()
    else:
        out[:, 0].copy_(initial)
    for index in range(1, x.shape[1]):
        torch.add(out[:, index - 1], x[:, index - 1], out=out[:, index])
    return out


def elu_plus_one(x: torch.Tensor, out: torch.Tensor | None = None, scratch: torch.Tensor | None = None):
    """elu(x) + 1 (`_EluPlusOne` under autograd), or written into `out` with `scratch` (no autograd)."""
    if out is None:
        return _EluPlusOne.apply(x)
    return _elu_plus_one(x, out, scratch)


def _elu_plus_one(x: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """elu(x) + 1 written into `out` (contiguous, x's shape), `scratch` (the same) holding the negative part; a
    fresh tensor for it without one."""
    y = out.copy_(x)
    negative_part = y.clamp(max=0.0) if scratch is None else torch.clamp(y, max=0.0, out=scratch)
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        # exp(x) = 2^(x log2 e): torch's vectorised exp2 is about twice as fast as its exp on the CPU, within
        # 1e-6 relative error in fp32 (bf16 would round x log2 e, so it keeps exp).
        negative_part.mul_(LOG2_E).exp2_()
    else:
        negative_part.exp_()
    return y.clamp_(min=0.0).add_(negative_part)


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0), and its derivative min(elu(x) + 1, 1): exp(x) below
    zero, 1 above. Faster than F.elu(x) + 1 in both directions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # Contiguous output (x is often a strided view of the fused projection), and as few fresh
        # allocations as possible: on the CPU each large one costs page faults.
        y = _elu_plus_one(x, torch.empty(x.shape, dtype=x.dtype, device=x.device))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y.clamp(max=1.0).mul_(grad)


def favor_applies(q: torch.Tensor, projection: torch.Tensor, dropout_p: float) -> bool:
    """`favor_bidirectional`: fp32 / fp64 on the CPU, without attention dropout, the features fixed (a buffer), not
    while torch.export traces (the reference's public ops export as they are)."""
    return (
        q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and dropout_p == 0.0
        and not projection.requires_grad and not torch.compiler.is_exporting()
    )  # fmt: skip


def favor_bidirectional(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional linear attention with FAVOR+ features, (B, H, T, D), (B, G, S, D), (B, G, S, E) -> (B, H, T, E):
    linear.py's `favor_feature_map` on q and k, then its `_bidirectional`, as one autograd.Function."""
    return _FavorBidirectional.apply(q, k, v, projection, key_padding_mask)


def _favor_features(x: torch.Tensor, projection: torch.Tensor, is_query: bool) -> torch.Tensor:
    """feature_maps.favor_feature_map of x' = x / d^(1/4) (N, L, d), in place on one fresh (N, L, m) tensor: the
    logits from one bmm per head (a 4-D x @ 2-D projection folds into one long mm, ~1.6x slower here), then the
    row term |x'|^2 / 2, the query's stabiliser and the 1 / sqrt(m) taken into the exponent, and exp as exp2
    (twice as fast as exp on the CPU)."""
    count, dim = x.shape[0], x.shape[-1]
    logits = torch.bmm(x, projection.T.expand(count, dim, projection.shape[0]))
    shift = (x * x).sum(-1, keepdim=True).div_(2.0)
    if is_query:  # as favor_feature_map: only a row whose largest logit passes the limit is scaled down
        limit = math.log(torch.finfo(x.dtype).max) / 4
        shift += (logits.amax(dim=-1, keepdim=True) - shift - limit).clamp_(min=0.0)
    shift += 0.5 * math.log(projection.shape[0])
    return logits.sub_(shift).mul_(LOG2_E).exp2_()


class _FavorBidirectional(torch.autograd.Function):
    """FAVOR+ features and O(n m d) bidirectional attention with a hand-written backward: the reference's autograd
    graph makes a fresh (n, m) tensor for nearly every elementwise step (each one page faults on the CPU) and
    products of a vector with a matrix (bmm with one column), slow here. Forward: phi(q), phi(k) in place; the
    state [S | z] = phi(K)^T [V | 1] and [numerator | denominator] = phi(Q) [S | z] as one product each.
    Backward, with g = d out: the numerator's gradient g / den and the denominator's -(g . out) / den as one
    (n, E + 1) matrix G; d phi(Q) = G [S | z]^T, d [S | z] = phi(Q)^T G, d phi(K) = [V | 1] d[S | z]^T; and through
    the features, with dL = d phi * phi (phi = exp(L)): d x' = dL W - x' sum_j dL_j (L = W x' - |x'|^2 / 2 + const)."""

    @staticmethod
    def forward(ctx, q, k, v, projection, key_padding_mask):
        batch, heads, length, dim = q.shape
        kv_heads, keys, width = k.shape[1], k.shape[2], v.shape[-1]
        scale = dim**-0.25
        weights = projection.to(q.dtype)
        # The query heads of a key/value head as one sequence: (B * G, groups * T, d).
        x_q = (q * scale).reshape(batch * kv_heads, -1, dim)
        x_k = (k * scale).reshape(batch * kv_heads, keys, dim)
        phi_q = _favor_features(x_q, weights, is_query=True)
        phi_k = _favor_features(x_k, weights, is_query=False)
        if key_padding_mask is not None:  # padded keys contribute nothing (and get no gradient: phi_k is 0 there)
            padding = key_padding_mask.bool()[:, None, :, None].expand(batch, kv_heads, keys, 1)
            phi_k.masked_fill_(padding.reshape(batch * kv_heads, keys, 1), 0.0)
        values = torch.cat([v.reshape(batch * kv_heads, keys, width), v.new_ones(batch * kv_heads, keys, 1)], dim=-1)
        state = phi_k.transpose(1, 2) @ values  # [S | z] (B * G, m, E + 1)
        both = phi_q @ state  # [numerator | denominator] (B * G, groups * T, E + 1)
        denominator = both[..., width:]
        real = denominator >= torch.finfo(denominator.dtype).tiny  # as linear._safe_normaliser
        denominator = torch.where(real, denominator, 1.0)
        out = both[..., :width] / denominator
        ctx.save_for_backward(x_q, x_k, weights, phi_q, phi_k, values, state, out, denominator, real)
        ctx.shapes = (q.shape, k.shape)
        return out.view(batch, heads, length, width)

    @staticmethod
    def backward(ctx, grad_out):
        x_q, x_k, weights, phi_q, phi_k, values, state, out, denominator, real = ctx.saved_tensors
        q_shape, k_shape = ctx.shapes
        width = out.shape[-1]
        grad = grad_out.reshape(out.shape)
        grad_both = torch.cat([grad, -(grad * out).sum(-1, keepdim=True) * real], dim=-1).div_(denominator)
        grad_phi_q = grad_both @ state.transpose(1, 2)  # (B * G, groups * T, m)
        grad_state = phi_q.transpose(1, 2) @ grad_both  # (B * G, m, E + 1)
        grad_phi_k = values @ grad_state.transpose(1, 2)  # (B * G, S, m)
        grad_v = phi_k @ grad_state[..., :width]
        scale = q_shape[-1] ** -0.25
        grad_q = _favor_features_backward(grad_phi_q, phi_q, x_q, weights).mul_(scale)
        grad_k = _favor_features_backward(grad_phi_k, phi_k, x_k, weights).mul_(scale)
        v_shape = k_shape[:-1] + (width,)
        return grad_q.view(q_shape), grad_k.view(k_shape), grad_v.view(v_shape), None, None


def _favor_features_backward(
    grad_phi: torch.Tensor, phi: torch.Tensor, x: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """d x' from d phi (a fresh tensor, overwritten): dL = d phi * phi, then dL W - x' * sum_j dL_j."""
    grad_logits = grad_phi.mul_(phi)
    count, _, features = grad_logits.shape
    grad_x = torch.bmm(grad_logits, weights.expand(count, features, weights.shape[1]))
    return grad_x.sub_(x * grad_logits.sum(-1, keepdim=True))
