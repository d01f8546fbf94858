"""Clustered attention's chunks (routing, LSH: zoo/attention/clustered.py) on the CPU's fused flash kernel, in
inference: one fused call does the chunks' scores, softmax, weighted values and log-sum-exp in one pass over the
scores (the reference path makes each of them a pass over the (chunks, C, 2C) scores). Same function as the
reference (tests/attention/test_routing_attention.py and test_lsh_attention.py run both settings of the switch).
"""

from __future__ import annotations

import torch

from zoo.attention.fast.blocks import fused_kernel_applies


def applies(inputs: tuple[torch.Tensor, ...], dropout_p: float) -> bool:
    """No gradient asked of `inputs` (q, k, v and the additive mask, which may hold a learned bias; training keeps
    the reference path), no dropout, and the fused kernel's own conditions."""
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    return not needs_grad and fused_kernel_applies(inputs[0], dropout_p, False)


def fused_chunks(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """queries (N, C, D), keys and values (N, K, D) (strided views allowed), additive mask (N, C, K) -> the
    softmax attention output (N, C, D) and log-sum-exp (N, C)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries[:, None], keys[:, None], values[:, None], attn_mask=mask[:, None]
    )
    return out[:, 0], lse[:, 0]
