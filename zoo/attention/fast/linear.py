"""Linear attention's CPU fast paths: long causal sequences a segment at a time with reused scratch tensors, the
exclusive prefix sum as a loop of row additions (`_ExclusivePrefixSum`), and elu + 1 through exp2 with its own
backward (`_EluPlusOne`).

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
