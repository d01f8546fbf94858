"""The attention math every kernel shares: the O(n^2) masked softmax formula (the reference every fast
path is checked against), softmax attention under a boolean mask and an additive score bias through fused
SDPA, masks, and the expansion of grouped key/value heads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# At or below this many keys the composite q k^T -> softmax -> @ v beats the fused CPU kernel, whose blocking
# costs more than the arithmetic there: 1.1-2.6x forward+backward for n <= 64, heads of 16-64 (recipes.md).
COMPOSITE_MAX_KEYS = 64


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention, with three CPU exceptions for training, all exact to fp32 rounding: short
    sequences (<= COMPOSITE_MAX_KEYS keys, no attention dropout) take the composite formula in fp32; long ones
    with a float mask that takes a gradient (a learned bias) keep the fused forward (_LearnedBiasAttention), and the
    rest in bf16/fp16 run the fused kernel in fp32: its low-precision backward is 4-14x slower than its fp32 one for
    heads of 16-64 dims (measured: (12, 4, 64, 32) causal, fwd+bwd 7.2 vs 1.6 ms)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, **options)
    mask = options.get("attn_mask")
    if mask is not None and mask.dim() < q.dim():
        # the fused CPU kernel takes a mask of q's rank as is; one of lower rank (a bias (H, T, S)) sends it to a
        # slower path: fwd+bwd 3-4x the 4-d view's time at (32, 4, 785, 16) (variant study, pixel sequences)
        options = {**options, "attn_mask": mask.reshape((1,) * (q.dim() - mask.dim()) + mask.shape)}
    low_precision = q.dtype in (torch.bfloat16, torch.float16)
    training = _needs_grad(q, k, v)
    # Inference keeps the fused kernel (its bf16 forward beat the composite in fp32 1.7x: recipes.md); an
    # exported graph keeps the one SDPA op that runtimes map to their own kernels.
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


class _LearnedBiasAttention(torch.autograd.Function):
    """Fused CPU attention whose float mask takes a gradient (a learned score bias: T5's). SDPA gives no mask
    gradient from its fused kernel, so it falls back to the O(n^2)-memory math path (3.5 s fwd+bwd at (32, 4, 785,
    16), one thread). Here the forward is the fused kernel (keeping the log-sum-exp) and the backward recomputes the
    probabilities one batch element at a time, so that q, k, v and the mask take their gradients from one (H, T, S)
    block: 2.0 s there, and memory O(n^2) per element instead of per batch."""

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
        k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
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
        k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
    *batch, q_len, dim = q.shape
    k_len = k.shape[-2]
    may_be_empty = attn_mask is not None  # a causal row always sees its first key
    if is_causal:  # SDPA's causal mask (it takes no attn_mask with it): the top-left aligned lower triangle
        attn_mask = additive_mask(causal_mask(q_len, k_len, q.device, offset=0), q.dtype)
    # 3-d GEMMs with the scale and the mask folded into baddbmm: on the heads' strided (B, H, T, D) views this
    # beats 4-d matmuls and a separate masked_fill (recipes.md)
    q, k, v = (t.reshape(-1, t.shape[-2], dim) for t in (q, k, v))
    alpha = dim**-0.5 if scale is None else scale
    if attn_mask is None:
        scores = torch.baddbmm(q.new_empty(()), q, k.transpose(1, 2), beta=0.0, alpha=alpha)
    else:
        bias = _additive(attn_mask, q.dtype)
        if bias.dim() > 2 and bias.shape[:-2].numel() > 1:  # per batch or head: one (T, S) matrix per GEMM
            bias = bias.expand(*batch, q_len, k_len).reshape(-1, q_len, k_len)
        else:  # one matrix for all: a broadcast view, no copy
            bias = (bias.reshape(bias.shape[-2:]) if bias.dim() > 2 else bias).expand(q.shape[0], q_len, k_len)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=alpha)
    # _safe_softmax: 0, not NaN, on an all -inf row (as the fused kernel gives), at ~1.5x softmax's cost
    probs = torch.ops.aten._safe_softmax(scores, -1) if may_be_empty else scores.softmax(dim=-1)
    return torch.bmm(probs, v).view(*batch, q_len, dim)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool (True = may attend) or additive float mask as an additive float one."""
    return additive_mask(mask, dtype) if mask.dtype == torch.bool else mask


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> float 0 / -inf, the form the fused CPU kernel takes without a copy."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, G, S, D) -> (B, G * groups, S, D): key/value head g serves query heads g * groups ... (g + 1) *
    groups - 1, as Llama's repeat_kv (grouped-query attention, Ainslie et al. 2023)."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def evaluate_bias(bias, q_len: int, k_len: int, device: torch.device, start: int = 0) -> torch.Tensor:
    """A ScoreBias (zoo/attention/contract.py) at queries start + k_len - q_len ... and keys start ... start +
    k_len - 1 (the queries are the last q_len positions): (H, q_len, k_len)."""
    keys = torch.arange(start, start + k_len, device=device)
    return bias(keys[k_len - q_len :], keys)


def causal_mask(q_len: int, k_len: int, device: torch.device, offset: int | None = None) -> torch.Tensor:
    """(q_len, k_len) bool, True = may attend. Query i sits at position offset + i (default: the last
    q_len positions of the keys), so a chunk of new queries sees all cached keys and itself."""
    if offset is None:
        offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    return torch.arange(k_len, device=device)[None, :] <= rows


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The O(n^2) textbook formula softmax(q k^T / sqrt(d) + mask) v, returning the probabilities too.

    `mask` is bool (True = may attend) or additive float, broadcastable to (B, H, T, S). Rows with no
    allowed key give zeros, as the fused kernels do.
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_p > 0.0:
        probs_dropped = F.dropout(probs, p=dropout_p)
        return probs_dropped @ v, probs
    return probs @ v, probs


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention under a bool mask `allowed` (True = may attend, broadcastable to (B, H, T, S)) with an
    additive score bias (float, broadcastable to (B, H, T, S)) if given; k and v may have grouped heads.

    Query rows with no allowed key (e.g. padded queries under a causal mask) output zeros; they are
    unmasked before the softmax and zeroed after it, so neither outputs nor gradients become NaN.
    """
    empty = None
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)  # (..., T, 1)
        # torch.export (ONNX) cannot branch on values: there empty rows are always handled, a no-op if none is
        if torch.compiler.is_exporting() or bool(empty.any()):
            allowed = allowed | empty
        else:
            empty = None
    mask = allowed
    if bias is not None:
        bias = bias.to(q.dtype)
        mask = bias if allowed is None else torch.where(allowed, bias, float("-inf"))
    if need_weights:  # the explicit formula needs every query head's keys; SDPA groups heads itself
        groups = q.shape[1] // k.shape[1]
        out, probs = softmax_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, dropout_p)
    else:
        if mask is not None:
            mask = _additive(mask, q.dtype)
        gqa = q.shape[1] != k.shape[1]
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
        probs = None
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
        probs = None if probs is None else probs.masked_fill(empty, 0.0)
    return out, probs


def dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias) v over all keys; k and v may have grouped heads (B, G, S, D). Causal
    with fewer queries than keys: the queries are the last positions (decoding). Without a padding mask,
    weights or bias this is one fused SDPA call; a bias (H, T, S) rides along as a float mask."""
    q_len, k_len = q.shape[2], k.shape[2]
    if causal and q_len == 1:
        causal = False  # a single newest query sees every key
    if key_padding_mask is None and not need_weights and bias is None and not (causal and q_len != k_len):
        gqa = q.shape[1] != k.shape[1]
        return sdpa(q, k, v, is_causal=causal, dropout_p=dropout_p, enable_gqa=gqa), None
    allowed = None
    if key_padding_mask is not None:
        allowed = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        band = causal_mask(q_len, k_len, q.device)
        allowed = band if allowed is None else allowed & band
    return masked_attention(q, k, v, allowed, dropout_p, need_weights, bias)
