"""The pattern kernels' union of parts on the CPU's fused flash kernel (`_FusedUnion`), and block windows with a
block-by-block backward (`_BlockWindows`).

The fast path of zoo/attention/blockwise.py, which holds the same function as the parts' explicit formula
under autograd (both checked against the masked O(n^2) formula in tests/attention/, under both settings of
the switch): the fused kernel returns each part's log-sum-exp, and its own backward, given the merged output
and log-sum-exp, yields the gradients of the one joint softmax (as ring attention does).
"""

from __future__ import annotations

import torch


def block_windows(x: torch.Tensor, left: int, right: int, block: int, n_blocks: int, windows) -> torch.Tensor:
    """`windows(x, left, right, block, n_blocks)` (blockwise.py's strided windows of whole blocks) whose backward
    adds each window's gradient back block by block."""
    return _BlockWindows.apply(x, left, right, block, n_blocks, windows)


def merge_into(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor) -> None:
    """out (..., L, D) and lse (..., L) in place <- the softmax over their keys and a disjoint part's (part_out,
    part_lse of the same shapes), by log-sum-exp. A row with no key in either (both -inf) weighs both by 0 and
    keeps lse -inf."""
    merged = torch.logaddexp(lse, part_lse)
    finite = merged.clamp(min=-1e30)  # exp(-inf - finite) = 0 where a row has no key at all
    out.mul_((lse - finite).exp_()[..., None]).addcmul_(part_out, (part_lse - finite).exp_()[..., None])
    lse.copy_(merged)


def fused_union(merge, layouts, masks, has_keys, shape, queries, keys, values) -> torch.Tensor:
    """The parts' (queries, keys, values) through the fused kernel, merged by `merge`: (B, n, H, D)."""
    return _FusedUnion.apply(merge, layouts, masks, has_keys, shape, *queries, *keys, *values)


def fused_kernel_applies(q: torch.Tensor, dropout_p: float, score_bias_requires_grad: bool) -> bool:
    """The fused path: CPU, no attention dropout, no learned bias (the kernel gives no bias gradient), and a
    PyTorch that has the CPU flash kernel's log-sum-exp entry point."""
    return (
        q.device.type == "cpu"
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
        and dropout_p == 0.0
        and not score_bias_requires_grad
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


class _BlockWindows(torch.autograd.Function):
    """`blocked_windows` (the `windows` given) whose backward adds the gradient of each window back block by block
    (the windows are whole blocks here): a few shifted additions instead of autograd's general unfold backward.
    Entries of a window outside its own sequence (always masked keys) pass no gradient on."""

    @staticmethod
    def forward(ctx, x, left, right, block, n_blocks, windows):
        ctx.shape, ctx.sizes = x.shape, (left // block, right // block, block, n_blocks)
        return windows(x, left, right, block, n_blocks)

    @staticmethod
    def backward(ctx, grad):
        (batch, heads, length, dim), (before, after, block, n_blocks) = ctx.shape, ctx.sizes
        pieces = grad.view(batch, n_blocks, heads, before + 1 + after, block, dim)
        total = grad.new_zeros(batch, before + n_blocks + after, heads, block, dim)
        for piece in range(before + 1 + after):  # piece j of block b's window is block b - before + j
            total[:, piece : piece + n_blocks] += pieces[:, :, :, piece]
        total = total[:, before : before + n_blocks].permute(0, 2, 1, 3, 4).reshape(batch, heads, -1, dim)
        return total[:, :, :length], None, None, None, None, None


class _FusedUnion(torch.autograd.Function):
    """The parts through the fused CPU flash kernel, merged by `merge` (blockwise.py's `_merge`); backward through
    the kernel's own backward, given the merged output and log-sum-exp (so each part's gradients are those of the
    joint softmax)."""

    @staticmethod
    def forward(ctx, merge, layouts, masks, has_keys, shape, *tensors):
        count = len(layouts)
        queries, keys, values = tensors[:count], tensors[count : 2 * count], tensors[2 * count :]
        outs, lses = [], []
        for q, k, v, mask, has_key in zip(queries, keys, values, masks, has_keys):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)
            outs.append(out)
            lses.append(lse.masked_fill(~has_key, float("-inf")))
        out, lse = merge(layouts, outs, lses, shape)
        ctx.layouts, ctx.masks = layouts, masks
        ctx.save_for_backward(*tensors, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        *tensors, out, lse = ctx.saved_tensors
        layouts = ctx.layouts
        count = len(layouts)
        grad_out, out = grad_out.transpose(1, 2), out.transpose(1, 2)  # (B, H, n, D)
        grads = [None] * (3 * count)
        for index, (layout, mask) in enumerate(zip(layouts, ctx.masks)):
            q, k, v = tensors[index], tensors[count + index], tensors[2 * count + index]
            grad_q, grad_k, grad_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                layout.gather(grad_out).contiguous(), q, k, v, layout.gather(out).contiguous(),
                layout.gather(lse).contiguous(), 0.0, False, attn_mask=mask,
            )  # fmt: skip
            grads[index], grads[count + index], grads[2 * count + index] = grad_q, grad_k, grad_v
        return None, None, None, None, None, *grads
