"""Full attention with a relative position bias (ALiBi, T5) on the CPU's fused flash kernel, one query block at a
time (`_RelativeBiasAttention`): the bias is never an (H, n, n) tensor, nor one per batch element.

The fast path of zoo/attention/full.py, whose reference is the dense formula there (softmax(q k^T / sqrt(d) +
bias(i, j)) v with the bias evaluated as an (H, n, n) mask); both are checked against each other and against the
textbook formula in fp64 (tests/attention/test_biases.py), under both settings of the switch.

How: ALiBi and T5 depend on the distance j - i only, and T5's is constant beyond some distance M on each side (its
last bucket). So the bias is a short table over distances, `table[:, c]` for c = clamp(j - i, -M, M) + M (ALiBi:
M = n, every distance its own entry), evaluated once per call through the bias module (autograd carries the table's
gradient to T5's embedding, summed by bucket). Each query block gathers its (H, block, n) slice from the table,
broadcast over the batch. Key padding becomes one extra channel, q' = [q, 1], k' = [k, -1e30 if padded else 0],
v' = [v, 0], so that q' . k' is q . k on kept keys and -1e30 on padded ones: the mask stays per head, not per batch
element. The backward is the flash kernel's own per block (with the same slice); a learned table also takes
d table[c] = sum of dS over the entries of distance class c: dS recomputed explicitly only in the band |j - i| < M
around each block, and the classes beyond it from the column sums of dS that the extra channel's key gradient
carries (dk'[j, D] = scale * sum_i dS[i, j]).
"""

from __future__ import annotations

import torch

from zoo.attention.biases import ALiBi, T5RelativeBias, relative_position_bucket

PADDED = -1e30  # the extra key channel of a padded key: exp underflows to exactly 0 after the softmax's shift
BLOCK_ELEMENTS = 2**18  # query block size: H * block * n bias entries at most (the slice's memory), at least 16 rows


def applies(q: torch.Tensor, k: torch.Tensor, bias: object, dropout_p: float, need_weights: bool) -> bool:
    """The fast path: CPU self-attention (as many queries as keys) with ALiBi or T5, no dropout, no weights."""
    return (
        q.device.type == "cpu"
        and isinstance(bias, (ALiBi, T5RelativeBias))
        and q.shape[2] == k.shape[2]
        and dropout_p == 0.0
        and not need_weights
        and q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
        and not torch.compiler.is_exporting()
    )


def constant_beyond(bias: torch.nn.Module, length: int) -> int:
    """M: the bias takes one value (one parameter) for all j - i <= -M and one for all j - i >= M; at most length."""
    if not isinstance(bias, T5RelativeBias):
        return length  # ALiBi: every distance differs
    distance = torch.arange(bias.max_distance + 2)
    reach = 0
    for sign in (-1, 1):
        buckets = relative_position_bucket(sign * distance, bias.bidirectional, bias.num_buckets, bias.max_distance)
        differs = (buckets != buckets[-1]).nonzero()
        reach = max(reach, int(differs.max()) + 1 if len(differs) else 0)
    return max(1, min(reach, length))


def distance_table(bias: torch.nn.Module, reach: int, device: torch.device) -> torch.Tensor:
    """(H, 2 * reach + 1): entry c is the bias at distance j - i = c - reach, the ends standing for every distance
    beyond them; evaluated by the bias module itself at those positions (so autograd reaches T5's table)."""
    near = bias(torch.tensor([reach - 1], device=device), torch.arange(2 * reach - 1, device=device))[:, 0]
    left = bias(torch.tensor([reach], device=device), torch.tensor([0], device=device))[:, 0]
    right = bias(torch.tensor([0], device=device), torch.tensor([reach], device=device))[:, 0]
    return torch.cat([left, near, right], dim=-1)


def relative_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.nn.Module,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias(i, j)) v for q (B, H, n, D), k, v (B, G, n, D) -> (B, H, n, D); key padding
    (B, n) bool, True = padding. Query rows with no key to attend to give zeros."""
    batch, heads, length, dim = q.shape
    if k.shape[1] != heads:  # the kernel takes no grouped heads; autograd sums the copies' gradients back
        k, v = (t.repeat_interleave(heads // k.shape[1], dim=1) for t in (k, v))
    reach = constant_beyond(bias, length)
    table = distance_table(bias, reach, q.device)
    padding = None if key_padding_mask is None else key_padding_mask.bool()
    low_precision = q.dtype in (torch.bfloat16, torch.float16)
    compute = torch.float32 if low_precision else q.dtype  # the fused kernel's low-precision backward is slow
    with torch.autocast("cpu", enabled=False):
        out = _RelativeBiasAttention.apply(
            q.to(compute), k.to(compute), v.to(compute), table.to(compute), padding, causal, reach
        )
    if padding is not None:  # rows that see no key at all (padded sequences) give zeros, as the fused kernels do
        kept = ~padding
        if causal:
            kept = kept.cummax(dim=-1).values  # query i sees a key iff one at or before i is kept
        else:
            kept = kept.any(dim=-1, keepdim=True).expand(batch, length)
        out = out.masked_fill(~kept[:, None, :, None], 0.0)
    return out.to(q.dtype)


def _block_size(heads: int, length: int) -> int:
    return max(16, min(length, BLOCK_ELEMENTS // max(1, heads * length)))


def _classes(rows: torch.Tensor, cols: torch.Tensor, reach: int, causal: bool) -> torch.Tensor:
    """(rows, cols) table entries of each (query, key) pair; causal future keys take the extra -inf entry."""
    distance = cols[None, :] - rows[:, None]
    classes = distance.clamp(-reach, reach) + reach
    return classes.masked_fill(distance > 0, 2 * reach + 1) if causal else classes


class _RelativeBiasAttention(torch.autograd.Function):
    """Blocks of queries through the fused flash kernel with their (H, block, n) bias slices (see the module's
    docstring); backward block by block through the kernel's backward, plus the table's gradient if it takes one."""

    @staticmethod
    def forward(ctx, q, k, v, table, padding, causal, reach):
        batch, heads, length, dim = q.shape
        scale = dim**-0.5
        extended = torch.cat([table, table.new_full((heads, 1), float("-inf"))], dim=-1)  # + the causal -inf entry
        augmented = padding is not None or table.requires_grad
        if augmented:
            key_channel = torch.zeros(batch, 1, length, 1, dtype=q.dtype)
            if padding is not None:
                key_channel.masked_fill_(padding[:, None, :, None], PADDED)
            q = torch.cat([q, q.new_ones(batch, heads, length, 1)], dim=-1)
            k = torch.cat([k, key_channel.expand(batch, heads, length, 1)], dim=-1)
            v = torch.cat([v, v.new_zeros(batch, heads, length, 1)], dim=-1)
        block = _block_size(heads, length)
        positions = torch.arange(length)
        outs, lses = [], []
        for start in range(0, length, block):
            rows = positions[start : start + block]
            mask = extended[:, _classes(rows, positions, reach, causal)][None]  # (1, H, block, n)
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, rows].contiguous(), k, v, attn_mask=mask, scale=scale
            )
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, extended, out, lse)
        ctx.settings = (causal, reach, block, scale, dim, augmented)
        return out[..., :dim] if augmented else out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, extended, out, lse = ctx.saved_tensors
        causal, reach, block, scale, dim, augmented = ctx.settings
        batch, heads, length, _ = q.shape
        if augmented:
            grad_out = torch.cat([grad_out, grad_out.new_zeros(batch, heads, length, 1)], dim=-1)
        grad_out = grad_out.contiguous()
        learned = ctx.needs_input_grad[3]
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dtable = extended.new_zeros(extended.shape) if learned else None
        positions = torch.arange(length)
        for start in range(0, length, block):
            rows = positions[start : start + block]
            mask = extended[:, _classes(rows, positions, reach, causal)][None]
            q_block, out_block, lse_block, grad_block = (
                t[:, :, rows].contiguous() for t in (q, out, lse, grad_out)
            )
            dq_block, dk_part, dv_part = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_block, q_block, k, v, out_block, lse_block, 0.0, False, attn_mask=mask, scale=scale
            )
            dq[:, :, rows] = dq_block
            dk += dk_part
            dv += dv_part
            if learned:
                _table_grad(dtable, q_block, k, v, out_block, lse_block, grad_block, extended, dk_part, rows, reach,
                            causal, scale, dim)  # fmt: skip
        if augmented:
            dq, dk, dv = dq[..., :dim], dk[..., :dim], dv[..., :dim]
        return dq, dk, dv, (dtable[:, :-1] if learned else None), None, None, None


def _table_grad(dtable, q, k, v, out, lse, grad_out, extended, dk_part, rows, reach, causal, scale, dim) -> None:
    """Add one query block's share of d table: sum over the batch and the block of dS by distance class.

    The band of keys within reach of the block takes dS explicitly (scores and probabilities recomputed from the
    kept log-sum-exp); keys beyond it are in the end classes for every query of the block, so their share is their
    column sums of dS, which the extra channel's key gradient holds (dk'[..., dim] = scale * sum_i dS[i, j])."""
    length = k.shape[2]
    first, last = int(rows[0]), int(rows[-1])
    lo, hi = max(0, first - reach + 1), min(length, last + reach)  # keys with a near distance to some row
    cols = torch.arange(lo, hi)
    scores = torch.matmul(q, k[:, :, lo:hi].transpose(-1, -2)) * scale + extended[:, _classes(rows, cols, reach, causal)]
    probs = torch.exp(scores - lse[..., None])  # (B, H, block, window)
    delta = (grad_out * out).sum(-1, keepdim=True)  # softmax's backward: rowsum(dP * P) = rowsum(dO * O)
    grad_scores = probs * (torch.matmul(grad_out, v[:, :, lo:hi].transpose(-1, -2)) - delta)
    classes = _classes(rows, cols, reach, causal).flatten()
    dtable.index_add_(1, classes, grad_scores.sum(0).flatten(1))
    column_sums = dk_part[..., dim].sum(0) / scale  # (H, n)
    dtable[:, 0] += column_sums[:, :lo].sum(-1)
    dtable[:, 2 * reach] += column_sums[:, hi:].sum(-1)
