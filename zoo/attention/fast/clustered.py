"""Clustered attention's chunks (routing, LSH: zoo/attention/clustered.py) on the CPU's fused flash kernel: one
fused call does the chunks' scores, softmax, weighted values and log-sum-exp in one pass over the scores (the
reference path makes each of them a pass over the (chunks, C, 2C) scores). Same function as the reference
(tests/attention/test_routing_attention.py and test_lsh_attention.py run both settings of the switch).

Chunks without a self rule or a bias (routing's; `own_and_previous`), in inference and training, take no
(chunks, C, 2C) mask: a query sees its own chunk (up to itself when causal) and the previous chunk of its cluster
whole, so it is two kernel calls merged by log-sum-exp, each with at most a per-key mask (padding, or the own
chunk's empty slots), the second only for the chunks that have a previous chunk. The chunks go in classes by
how many real slots they hold, each cut to its longest (a cluster's last chunk is mostly short). The backward
is the kernel's own, given the merged output and log-sum-exp (`_OwnAndPrevious`).

LSH's rounds, in training as well (`joint_rounds`): the rounds combined by their log-sum-exps are one softmax
over all the rounds' keys, so each round is one fused call forward and one fused backward given the combined
output and log-sum-exp (blocks.fused_union), instead of the reference's passes over each round's scores and the
log-sum-exps' own gradients.

Measured against the reference and routing-transformer in experiments/results/content_attention.md (re-measure
with experiments/routing_speed.py).
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


def applies_own_and_previous(
    inputs: tuple[torch.Tensor, ...], dropout_p: float, no_self: bool, bias, need_lse: bool
) -> bool:
    """`own_and_previous`: no self rule (LSH's), no position bias, no dropout, on the CPU's fused kernel; in
    training (a gradient asked of q, k or v) float32 or float64 (the kernel's low-precision backward is slow), and
    no log-sum-exp asked for (it takes no gradient here)."""
    q = inputs[0]
    wants_grad = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    precisions = (torch.float32, torch.float64) + (() if wants_grad else (torch.bfloat16, torch.float16))
    return (
        not no_self
        and bias is None
        and dropout_p == 0.0
        and q.device.type == "cpu"
        and q.dtype in precisions
        and not (wants_grad and need_lse)
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


def own_and_previous(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks, *, causal: bool, padded: bool, need_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k, v (B, H, n, D) and their `clustered.Chunks` -> the clustered attention output (B, H, n, D) and, with
    `need_lse` (inference only), the log-sum-exp (B, H, n; -inf where a query has no key). `padded`: some keys
    are padding (the kernel calls then take per-key masks)."""
    layout = _Classes(chunks, causal, padded)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return _OwnAndPrevious.apply(q, k, v, layout), None
    out, lse, _ = _attend(layout, *(layout.padded(x) for x in (q, k, v)), need_lse)
    return out, lse


# The chunks go to the kernel in classes by how many real slots they hold, each class cut to its longest: a
# cluster's last chunk is mostly short (clusters hold about a chunk's worth of tokens), and its empty slots would
# cost the kernel as much as real ones. Cut at quarters of the chunk: the short last chunks mostly fall in the
# first, the full ones in the last (experiments/results/content_attention.md, issue 72).
LENGTH_CLASSES = 4


class _Class:
    """The chunks of one length class: their first `length` slots as rows of the token vectors, and for those that
    have a previous chunk, its whole C slots."""

    def __init__(self, members, length, token_rows, key_mask, has_previous, causal: bool, padded: bool) -> None:
        chunk = token_rows.shape[1]
        self.length, self.chunk = length, chunk
        self.rows = token_rows[members, :length].flatten()  # (chunks * length,)
        self.with_previous = has_previous[members].nonzero().squeeze(1)  # positions within the class
        self.previous_rows = token_rows[members[self.with_previous] - 1].flatten()  # (P * C,): a full chunk
        # Without padding, causal chunks need no mask: a query sees its own chunk's slots up to itself, all real (a
        # chunk's real slots come first), and the previous chunk of a cluster is full. Otherwise per-key masks.
        own_mask = key_mask[members, chunk : chunk + length][:, None, None]  # (chunks, 1, 1, length)
        self.own_mask = own_mask if padded or not causal else None
        self.previous_mask = key_mask[members[self.with_previous], None, None, :chunk] if padded else None


class _Classes:
    """The indices `own_and_previous` lays tokens out by, from a `clustered.Chunks` (N = B * H rows, M chunks of
    C): the chunks in length classes, each slot's row of the (N * n + 1) token vectors (the last, a zero row, for
    an empty slot: its query and gradient rows are zero, so it adds nothing to any key's gradient)."""

    def __init__(self, chunks, causal: bool, padded: bool) -> None:
        length = chunks.shape[2]
        rows, _, chunk = chunks.has_key.shape
        self.shape, self.causal, self.tokens = chunks.shape, causal, rows * length
        offsets = length * torch.arange(rows, device=chunks.slots.device)[:, None]
        token_rows = torch.where(chunks.token_at >= 0, chunks.token_at + offsets, self.tokens).view(-1, chunk)
        real = (chunks.token_at >= 0).view(-1, chunk).sum(dim=-1)  # (N * M,): every chunk holds one at least
        key_mask = chunks.key_mask.flatten(0, 1)  # (N * M, 2C): previous chunk's keys, own chunk's keys
        # The previous chunk is attended only by the chunks that have one of their cluster with a usable key (a
        # cluster's first chunk has none): the second kernel call covers those chunks only.
        has_previous = key_mask[:, :chunk].isfinite().any(dim=-1)
        self.classes, shorter = [], 0
        for quarter in range(1, LENGTH_CLASSES + 1):
            longest = -(-quarter * chunk // LENGTH_CLASSES)
            members = ((real > shorter) & (real <= longest)).nonzero().squeeze(1)
            if members.numel():
                self.classes.append(_Class(members, longest, token_rows, key_mask, has_previous, causal, padded))
            shorter = longest

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, n, D) -> (N * n + 1, D): the token vectors and a zero row."""
        return torch.nn.functional.pad(x.reshape(self.tokens, x.shape[-1]), (0, 0, 0, 1))

    def to_tokens(self, rows: torch.Tensor) -> torch.Tensor:
        """(N * n + 1, ...) -> (B, H, n, ...): the token rows, without the zero row."""
        return rows[: self.tokens].view(*self.shape[:3], *rows.shape[1:])


def _lay_out(rows: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
    """(N * n + 1, D) token rows -> (chunks, 1, length, D) at `index`."""
    return rows.index_select(0, index).view(-1, 1, length, rows.shape[-1])


def _attend(layout: _Classes, q_rows, k_rows, v_rows, need_lse: bool = False):
    """Token rows (N * n + 1, D) -> out (B, H, n, D), the log-sum-exp (B, H, n) if `need_lse`, and per class the
    tensors its backward reads: the own chunks' queries, keys, values, merged output and log-sum-exp, then for
    the chunks with a previous chunk, their queries, the previous keys and values, merged output and lse."""
    out_rows = q_rows.new_empty(q_rows.shape)
    lse_rows = q_rows.new_empty(q_rows.shape[0], dtype=torch.float32) if need_lse else None
    saved = []
    for group in layout.classes:
        own = [_lay_out(x, group.rows, group.length) for x in (q_rows, k_rows, v_rows)]
        out, lse = _fused(*own, group.own_mask, layout.causal)
        if group.own_mask is not None:  # the kernel gives a row that sees no key log-sum-exp 0: count it absent
            mask = group.own_mask
            no_key = _no_own_key(mask[:, 0, 0])[:, None] if layout.causal else _no_key(mask)
            lse.masked_fill_(no_key, float("-inf"))
        previous = group.with_previous
        parts = []
        if previous.numel():
            parts = [own[0][previous]] + [_lay_out(x, group.previous_rows, group.chunk) for x in (k_rows, v_rows)]
            part_out, part_lse = _fused(*parts, group.previous_mask, False)
            chunk_out, chunk_lse = out[previous], lse[previous]
            merge_into(chunk_out, chunk_lse, part_out, part_lse)
            out[previous], lse[previous] = chunk_out, chunk_lse
            parts += [chunk_out, chunk_lse]
        out_rows.index_copy_(0, group.rows, out.view(-1, out.shape[-1]))
        if need_lse:
            lse_rows.index_copy_(0, group.rows, lse.flatten().float())
        saved.append([*own, out, lse, *parts])
    lse = layout.to_tokens(lse_rows) if need_lse else None
    return layout.to_tokens(out_rows), lse, saved


class _OwnAndPrevious(torch.autograd.Function):
    """Clustered attention over the own chunk and the previous chunk of each chunk by fused kernel calls
    (`_attend`); backward through the kernel's own backward given the merged output and log-sum-exp (each part's
    gradients are then those of the joint softmax). The reference path (clustered.chunk_attention under
    autograd) spends its backward on the (chunks, C, 2C) scores, mask, softmax and the strided windows' unfold
    backward. Every token sits in one slot, so the own chunks' gradients go back to token order by a copy; the
    previous chunks' key and value gradients are then added."""

    @staticmethod
    def forward(ctx, q, k, v, layout: _Classes):
        out, _, saved = _attend(layout, *(layout.padded(x) for x in (q, k, v)))
        ctx.layout, ctx.sizes = layout, [len(tensors) for tensors in saved]
        ctx.save_for_backward(*(tensor for tensors in saved for tensor in tensors))
        return out

    @staticmethod
    def backward(ctx, grad):
        layout = ctx.layout
        saved = iter(ctx.saved_tensors)
        grad_rows = layout.padded(grad)
        grads = [grad_rows.new_empty(grad_rows.shape) for _ in "qkv"]
        previous_grads = []
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        for group, size in zip(layout.classes, ctx.sizes):
            q, k, v, out, lse, *parts = (next(saved) for _ in range(size))
            grad_out = _lay_out(grad_rows, group.rows, group.length)
            own = backward(grad_out, q, k, v, out, _finite(lse), 0.0, layout.causal, attn_mask=group.own_mask)
            if parts:
                q, k, v, out, lse = parts
                previous = group.with_previous
                part = backward(
                    grad_out[previous], q, k, v, out, _finite(lse), 0.0, False, attn_mask=group.previous_mask
                )
                own[0].index_add_(0, previous, part[0])
                previous_grads.append((group.previous_rows, part[1], part[2]))
            for total, own_grad in zip(grads, own):
                total.index_copy_(0, group.rows, own_grad.view(-1, own_grad.shape[-1]))
        for rows, grad_k, grad_v in previous_grads:  # after every copy: a previous chunk may be in another class
            grads[1].index_add_(0, rows, grad_k.view(-1, grad_k.shape[-1]))
            grads[2].index_add_(0, rows, grad_v.view(-1, grad_v.shape[-1]))
        return *(layout.to_tokens(total) for total in grads), None


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """A row with no key (-inf) at log-sum-exp 0: its probabilities are exp(-inf - 0) = 0 all the same."""
    return lse.masked_fill(lse.isinf(), 0.0)


def _fused(queries, keys, values, mask, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused kernel call on (N, 1, C, D) chunks: out (N, 1, C, D), log-sum-exp (N, 1, C)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries, keys, values, is_causal=causal, attn_mask=mask
    )


def _no_key(mask: torch.Tensor) -> torch.Tensor:
    """(N, 1, 1, C) additive per-key mask -> (N, 1, 1): every key hidden."""
    return mask[:, 0].isinf().all(-1, keepdim=True)


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
