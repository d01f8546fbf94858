"""Clustered attention's chunks (routing, LSH: zoo/attention/clustered.py) on the CPU's fused flash kernel, in
inference: one fused call does the chunks' scores, softmax, weighted values and log-sum-exp in one pass over the
scores (the reference path makes each of them a pass over the (chunks, C, 2C) scores). Same function as the
reference (tests/attention/test_routing_attention.py and test_lsh_attention.py run both settings of the switch).

Causal chunks without a self rule or a bias (`causal_chunks`) take no (chunks, C, 2C) mask at all: a chunk's
query r sees the previous chunk whole and its own up to r, so it is two calls merged by log-sum-exp, one over the
previous chunk and one over the own chunk with the kernel's is_causal, each with only a per-key mask (unusable,
padded, or another cluster's previous chunk: (chunks, 1, 1, C), broadcast by the kernel over the queries).
Measured side by side at 8192 tokens: 7% faster than the dense mask's call, forward peak memory a third lower
(experiments/results/content_attention.md; re-measure there).

LSH's rounds, in training as well (`joint_rounds`): the rounds combined by their log-sum-exps are one softmax
over all the rounds' keys, so each round is one fused call forward and one fused backward given the combined
output and log-sum-exp (blocks.fused_union), instead of the reference's passes over each round's scores and the
log-sum-exps' own gradients.
"""

from __future__ import annotations

from functools import partial

import torch

from zoo.attention.fast.blocks import fused_kernel_applies, fused_union, merge_into
from zoo.attention.functional import fill_rows_


def applies(inputs: tuple[torch.Tensor, ...], dropout_p: float) -> bool:
    """No gradient asked of `inputs` (q, k, v and the additive mask, which may hold a learned bias; training keeps
    the reference path), no dropout, and the fused kernel's own conditions."""
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    return not needs_grad and fused_kernel_applies(inputs[0], dropout_p, False)


def applies_causal(inputs: tuple[torch.Tensor, ...], dropout_p: float, causal: bool, no_self: bool, bias) -> bool:
    """`applies`, for causal chunks with no self rule (LSH's) and no position bias: the mask-free call."""
    return causal and not no_self and bias is None and applies(inputs, dropout_p)


def causal_chunks(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """queries (N, C, D), keys and values (N, 2C, D): each chunk's [previous, own] tokens (strided views allowed),
    key_mask (N, 2C) additive -> the causal attention output (N, C, D) and log-sum-exp (N, C)."""
    chunk = queries.shape[1]
    previous = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries[:, None], keys[:, None, :chunk], values[:, None, :chunk], attn_mask=key_mask[:, None, None, :chunk]
    )
    own = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries[:, None], keys[:, None, chunk:], values[:, None, chunk:], is_causal=True,
        attn_mask=key_mask[:, None, None, chunk:],
    )  # fmt: skip
    (out, lse), (own_out, own_lse) = ((part[0][:, 0], part[1][:, 0]) for part in (previous, own))
    # the kernel gives a row that sees no key of a part log-sum-exp 0 and output 0: count such a part as absent
    lse = lse.masked_fill(key_mask[:, None, :chunk].isinf().all(-1), float("-inf"))
    own_lse = own_lse.masked_fill(_no_own_key(key_mask[:, chunk:]), float("-inf"))
    merge_into(out, lse, own_out, own_lse)
    return out, lse


def _no_own_key(own_mask: torch.Tensor) -> torch.Tensor:
    """(N, C) additive mask of a chunk's own keys -> (N, C): query r sees none of keys 0 ... r."""
    return own_mask.isfinite().cumsum(-1) == 0


def fused_chunks(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """queries (N, C, D), keys and values (N, K, D) (strided views allowed), additive mask (N, C, K) -> the
    softmax attention output (N, C, D) and log-sum-exp (N, C)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries[:, None], keys[:, None], values[:, None], attn_mask=mask[:, None]
    )
    return out[:, 0], lse[:, 0]


# Below this many slots a chunk, the reference's batched matmuls beat one fused call per round (the kernel's
# per-call overhead over thousands of tiny chunks); above it the fused rounds win, more the longer the chunks.
# In bf16 the reference's batched matmuls beat the kernel's reduced-precision path at the study's shapes, so
# the fused rounds take float32 only. Measured side by side in experiments/results/content_attention.md (LSH
# training step); re-measure there.
FUSED_MIN_CHUNK = 24


def applies_rounds(q: torch.Tensor, masks: list[torch.Tensor], dropout_p: float) -> bool:
    """LSH's rounds as one fused joint softmax: float32, a gradient asked of q (without one, each round's fused
    inference call is as fast and merges less), chunks of at least FUSED_MIN_CHUNK slots, no dropout, no learned
    bias in the masks (the kernel's backward gives no mask gradient), the fused kernel's own conditions."""
    chunk = min(mask.shape[2] for mask in masks)
    wants_grad = torch.is_grad_enabled() and q.requires_grad
    return (
        q.dtype == torch.float32
        and wants_grad
        and chunk >= FUSED_MIN_CHUNK
        and fused_kernel_applies(q, dropout_p, any(mask.requires_grad for mask in masks))
    )


def joint_rounds(rounds: list, masks: list[torch.Tensor], to_tokens) -> torch.Tensor:
    """LSH's rounds (clustered.Chunks each, with its additive (N, M, C, 2C) mask; `to_tokens`: clustered.to_tokens,
    given by the caller so that this module imports no kernel module) -> out (B, H, n, D): the rounds
    combined by their log-sum-exps, which is one softmax over the keys of all rounds (a key found in several counts
    in each). The fused kernel does each round's scores, softmax and weighted values in one pass; its backward,
    given the combined output and log-sum-exp, yields each round's share of the joint softmax's gradients
    (blocks.fused_union), so the rounds' log-sum-exps need no gradient of their own. The reference path
    (lsh.py: chunk_attention per round, combine_rounds) makes each of those a pass over the scores."""
    layouts = [_Round(chunks) for chunks in rounds]
    # A row that is an empty slot or sees no key: all -inf. The backward lays every token-order tensor out by slot
    # (an empty slot reads token 0), so such a row must reach no key; the reference path never uses it.
    live = [chunks.has_key & (chunks.token_at >= 0).view_as(chunks.has_key) for chunks in rounds]
    for rows, mask in zip(live, masks):  # in place: the caller made these masks for this call
        fill_rows_(mask, ~rows, float("-inf"))
    kernel_masks = [mask.flatten(0, 1)[:, None] for mask in masks]
    has_keys = [rows.flatten(0, 1)[:, None] for rows in live]  # (N * M, 1, C), as the kernel's lse
    tensors = [[getattr(chunks, name)[:, None] for chunks in rounds] for name in ("queries", "keys", "values")]
    merge = partial(_merge_rounds, to_tokens)
    out = fused_union(merge, layouts, kernel_masks, has_keys, rounds[0].shape, *tensors)
    return out.transpose(1, 2)


class _Round:
    """A round's slots as fused_union's layout: `gather` lays a token-order tensor out in the round's chunks."""

    def __init__(self, chunks) -> None:
        self.chunks = chunks
        self.index = chunks.token_at.clamp(min=0)  # an empty slot reads token 0: its mask row hides every key

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, n, *rest) -> (N * M, 1, C, *rest)."""
        batch, heads, length = x.shape[:3]
        rows, rest = batch * heads, x.shape[3:]
        index = self.index.view(rows, -1, *([1] * len(rest))).expand(rows, -1, *rest)
        laid_out = x.reshape(rows, length, *rest).gather(1, index)
        return laid_out.view(-1, 1, self.chunks.has_key.shape[-1], *rest)


def _merge_rounds(to_tokens, layouts: list[_Round], outs: list[torch.Tensor], lses: list[torch.Tensor], shape):
    """Each round's (N * M, 1, C, D) outputs and (N * M, 1, C) log-sum-exps (-inf where no key) -> the joint output
    (B, n, H, D) and log-sum-exp (B, H, n; 0 where a query has no key in any round: finite for the backward)."""
    tokens = [to_tokens(out[:, 0], lse[:, 0], layout.chunks) for layout, out, lse in zip(layouts, outs, lses)]
    stacked = torch.stack([lse for _, lse in tokens])  # (R, B, H, n)
    any_key = (stacked > float("-inf")).any(dim=0)
    lse = torch.logsumexp(stacked.masked_fill(~any_key, 0.0), dim=0)
    weights = torch.exp(stacked - lse).masked_fill(~any_key, 0.0)
    out = sum(weight[..., None] * out for weight, (out, _) in zip(weights, tokens))
    return out.transpose(1, 2), lse
