"""F.scaled_dot_product_attention on the CPU by the fastest exact route: the composite formula for short
sequences, the fused forward with a batch-wise backward for a learned float mask (`_LearnedBiasAttention`), and
fp32 arithmetic for low-precision training.

The fast path of `zoo.attention.functional.sdpa`, whose reference is F.scaled_dot_product_attention itself; all
routes are exact to fp32 rounding (tests/attention/test_full_attention.py, test_backends.py, under both settings
of the switch). The thresholds were chosen by measurement: re-measure with `experiments/attention_benchmark.py
--rows sdpa full --lengths 64 256` (figures in experiments/results/recipes.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# At or below this many keys the composite q k^T -> softmax -> @ v beats the fused CPU kernel in training, whose
# blocking costs more than the arithmetic there.
COMPOSITE_MAX_KEYS = 64


def cpu_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention on the CPU, with three exceptions for training: short sequences (<=
    COMPOSITE_MAX_KEYS keys, no attention dropout) take the composite formula in fp32; long ones with a float mask
    that takes a gradient (a learned bias) keep the fused forward (_LearnedBiasAttention), and the rest in
    bf16/fp16 run the fused kernel in fp32: its low-precision backward is several times slower than its fp32
    one for heads of 16-64 dims."""
    mask = options.get("attn_mask")
    if mask is not None and mask.dim() < q.dim():
        # the fused CPU kernel takes a mask of q's rank as is; one of lower rank (a bias (H, T, S)) sends it to a
        # slower path
        options = {**options, "attn_mask": mask.reshape((1,) * (q.dim() - mask.dim()) + mask.shape)}
    low_precision = q.dtype in (torch.bfloat16, torch.float16)
    training = _needs_grad(q, k, v)
    # Inference keeps the fused kernel (its bf16 forward beat the composite in fp32); an exported graph keeps
    # the one SDPA op that runtimes map to their own kernels.
    if (
        training
        and k.shape[-2] <= COMPOSITE_MAX_KEYS
        and not options.get("dropout_p")
        and not torch.compiler.is_exporting()
    ):
        kernel = _composite_sdpa
    elif q.dim() == 4 and _learned_bias(mask) and not options.get("dropout_p") and not torch.compiler.is_exporting():
        kernel = _learned_bias_sdpa
    elif low_precision and training:
        kernel = F.scaled_dot_product_attention
    else:
        return F.scaled_dot_product_attention(q, k, v, **options)
    with torch.autocast("cpu", enabled=False):
        if not low_precision:
            return kernel(q, k, v, **options)
        mask = options.get("attn_mask")
        if mask is not None and mask.is_floating_point():
            options = {**options, "attn_mask": mask.float()}
        return kernel(q.float(), k.float(), v.float(), **options).to(q.dtype)


def _learned_bias(mask: torch.Tensor | None) -> bool:
    return mask is not None and mask.is_floating_point() and _needs_grad(mask)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _expand_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped key/value heads repeated for their query heads (as functional.repeat_kv)."""
    groups = q.shape[1] // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


class _LearnedBiasAttention(torch.autograd.Function):
    """Fused CPU attention whose float mask takes a gradient (a learned score bias: T5's). SDPA gives no mask
    gradient from its fused kernel, so it falls back to the O(n^2)-memory math path. Here the forward is the fused
    kernel (keeping the log-sum-exp) and the backward recomputes the probabilities one batch element at a time, so
    that q, k, v and the mask take their gradients from one (H, T, S) block: faster, and memory O(n^2) per element
    instead of per batch."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale = q.shape[-1] ** -0.5 if scale is None else scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, mask, out, lse = ctx.saved_tensors  # mask (1 or B, 1 or H, T or 1, S)
        scale = ctx.scale
        delta = (grad_out * out).sum(-1, keepdim=True)  # softmax's backward: rowsum(dP * P) = rowsum(dO * O)
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
        dmask = torch.zeros(mask.shape, dtype=mask.dtype)
        for b in range(q.shape[0]):
            row = b % mask.shape[0]
            probs = torch.baddbmm(mask[row] - lse[b].unsqueeze(-1), q[b], k[b].transpose(-1, -2), alpha=scale).exp_()
            torch.bmm(probs.transpose(-1, -2), grad_out[b], out=dv[b])
            scores_grad = probs.mul_(torch.bmm(grad_out[b], v[b].transpose(-1, -2)).sub_(delta[b]))
            torch.bmm(scores_grad, k[b], out=dq[b]).mul_(scale)
            torch.bmm(scores_grad.transpose(-1, -2), q[b], out=dk[b]).mul_(scale)
            dmask[row] += scores_grad.sum_to_size(dmask.shape[1:])
        return dq, dk, dv, dmask, None


def _learned_bias_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """F.scaled_dot_product_attention without dropout for a float mask that requires grad (_LearnedBiasAttention)."""
    if is_causal:
        raise ValueError("is_causal with an attn_mask: fold the causal band into the mask")
    if enable_gqa:
        k, v = _expand_kv(q, k, v)
    return _LearnedBiasAttention.apply(q, k, v, attn_mask, scale)


def _composite_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """F.scaled_dot_product_attention's arithmetic in plain ops, without dropout; a query row whose keys are
    all masked gives zeros, as the fused kernel's does."""
    if enable_gqa:
        k, v = _expand_kv(q, k, v)
    *batch, q_len, dim = q.shape
    k_len = k.shape[-2]
    may_be_empty = attn_mask is not None  # a causal row always sees its first key
    if is_causal:  # SDPA's causal mask (it takes no attn_mask with it): the top-left aligned lower triangle
        attn_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril()
    # 3-d GEMMs with the scale and the mask folded into baddbmm: on the heads' strided (B, H, T, D) views this
    # beats 4-d matmuls and a separate masked_fill
    q, k, v = (t.reshape(-1, t.shape[-2], dim) for t in (q, k, v))
    alpha = dim**-0.5 if scale is None else scale
    if attn_mask is None:
        scores = torch.baddbmm(q.new_empty(()), q, k.transpose(1, 2), beta=0.0, alpha=alpha)
    else:
        bias = attn_mask
        if bias.dtype == torch.bool:  # True = may attend -> 0 / -inf
            bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill_(~bias, float("-inf"))
        if bias.dim() > 2 and bias.shape[:-2].numel() > 1:  # per batch or head: one (T, S) matrix per GEMM
            bias = bias.expand(*batch, q_len, k_len).reshape(-1, q_len, k_len)
        else:  # one matrix for all: a broadcast view, no copy
            bias = (bias.reshape(bias.shape[-2:]) if bias.dim() > 2 else bias).expand(q.shape[0], q_len, k_len)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=alpha)
    # _safe_softmax: 0, not NaN, on an all -inf row (as the fused kernel gives), at a fraction above softmax's cost
    probs = torch.ops.aten._safe_softmax(scores, -1) if may_be_empty else scores.softmax(dim=-1)
    return torch.bmm(probs, v).view(*batch, q_len, dim)
