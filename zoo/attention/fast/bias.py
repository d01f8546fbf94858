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

from zoo.attention.biases import ALiBi, T5RelativeBias, constant_beyond, distance_table

PADDED = -1e30  # the extra key channel of a padded key: exp underflows to exactly 0 after the softmax's shift
# fp32 backward: bias entries whose probability is surely below exp(-UNDERFLOW) count as -inf (their share of any
# sum lies some 15 orders below fp32's resolution); left in, products of such tiny probabilities turn denormal, and
# denormal arithmetic slows the kernel's backward several times (ALiBi's far keys, any strongly negative bias).
UNDERFLOW = 50.0
# causal: query blocks of this many rows see only the keys up to their end, which spares the kernel the masked
# upper triangle (it skips masked tiles only for is_causal, which takes no bias)
CAUSAL_BLOCK = 256
BLOCK_ELEMENTS = 2**18  # learned-table backward: query blocks of H * block * n scores at most, at least 64 rows


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
    return max(64, min(length, BLOCK_ELEMENTS // max(1, heads * length)))


class _RelativeBiasAttention(torch.autograd.Function):
    """The fused flash kernel with the bias as a strided view of its diagonals (see the module's docstring); the
    keys go in reversed order, which makes the bias of query i and key slot c a function of i + c (a Hankel
    matrix), a view with unit strides that the kernel reads as it is (no copy). Backward: the kernel's own in one
    call, or, for a learned table, block by block with the table's gradient."""

    @staticmethod
    def forward(ctx, q, k, v, table, padding, causal, reach):
        batch, heads, length, dim = q.shape
        scale = dim**-0.5
        augmented = padding is not None or table.requires_grad
        k, v = k.flip(2), v.flip(2)
        if augmented:
            key_channel = torch.zeros(batch, 1, length, 1, dtype=q.dtype)
            if padding is not None:
                key_channel.masked_fill_(padding.flip(1)[:, None, :, None], PADDED)
            q = torch.cat([q, q.new_ones(batch, heads, length, 1)], dim=-1)
            k = torch.cat([k, key_channel.expand(batch, heads, length, 1)], dim=-1)
            v = torch.cat([v, v.new_zeros(batch, heads, length, 1)], dim=-1)
        anti_diagonals = _anti_diagonals(table, length, reach, causal)
        outs, lses = [], []
        for start, end, first in _blocks(length, CAUSAL_BLOCK if causal else length, causal):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, start:end], k[:, :, first:], v[:, :, first:],
                attn_mask=_hankel(anti_diagonals, start, end, first, length), scale=scale,
            )  # fmt: skip
            outs.append(out)
            lses.append(lse)
        out, lse = (torch.cat(parts, dim=2) if len(parts) > 1 else parts[0] for parts in (outs, lses))
        ctx.save_for_backward(q, k, v, table, out, lse)
        ctx.settings = (causal, reach, scale, dim, augmented)
        return out[..., :dim] if augmented else out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse = ctx.saved_tensors
        causal, reach, scale, dim, augmented = ctx.settings
        batch, heads, length, _ = q.shape
        if augmented:
            grad_out = torch.cat([grad_out, grad_out.new_zeros(batch, heads, length, 1)], dim=-1)
        grad_out = grad_out.contiguous()
        anti_diagonals = _anti_diagonals(table, length, reach, causal)
        if q.dtype == torch.float32:
            anti_diagonals = _without_underflow(anti_diagonals, q[..., :dim], k[..., :dim], lse, grad_out, scale)
        learned = ctx.needs_input_grad[3]
        if learned:
            block = _block_size(heads, length)
        else:
            block = CAUSAL_BLOCK if causal else length
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dtable = table.new_zeros(heads, table.shape[1] + 1) if learned else None  # + the causal entry
        for start, end, first in _blocks(length, block, causal):
            q_block, out_block, lse_block, grad_block = (
                t[:, :, start:end].contiguous() for t in (q, out, lse, grad_out)
            )
            dq_block, dk_part, dv_part = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_block, q_block, k[:, :, first:], v[:, :, first:], out_block, lse_block, 0.0, False,
                attn_mask=_hankel(anti_diagonals, start, end, first, length), scale=scale,
            )  # fmt: skip
            dq[:, :, start:end] = dq_block
            dk[:, :, first:] += dk_part
            dv[:, :, first:] += dv_part
            if learned:
                _table_grad(dtable, q_block, k, v, out_block, lse_block, grad_block, anti_diagonals, dk_part, start,
                            end, first, reach, causal, scale, dim)  # fmt: skip
        if learned:
            dtable = dtable[:, :-1]
        if augmented:
            dq, dk, dv = dq[..., :dim], dk[..., :dim], dv[..., :dim]
        return dq, dk.flip(2), dv.flip(2), dtable, None, None, None


def _blocks(length: int, block: int, causal: bool):
    """(start, end, first): query blocks and the first reversed key slot each needs (causal: keys up to its end)."""
    for start in range(0, length, block):
        end = min(start + block, length)
        yield start, end, length - end if causal else 0


def _anti_diagonals(table: torch.Tensor, length: int, reach: int, causal: bool) -> torch.Tensor:
    """(H, 2 length - 1), entry u the bias of query i and reversed key slot c = length - 1 - j with i + c = u, i.e.
    at distance j - i = length - 1 - u (causal: -inf after the query)."""
    extended = torch.cat([table, table.new_full((table.shape[0], 1), float("-inf"))], dim=-1)
    distance = length - 1 - torch.arange(2 * length - 1)
    return extended[:, _classes(torch.tensor([0]), distance, reach, causal)[0]].contiguous()


def _without_underflow(anti_diagonals, q, k, lse, grad_out, scale) -> torch.Tensor:
    """-inf for each head's bias entries b with exp(b + scale q . k - lse) < exp(-UNDERFLOW) for every query and
    key, by |q . k| <= |q| max |k|. Rows without gradient are left out: their dS is 0 whatever their probabilities
    (padded queries, whose nearest kept keys may lie far away, would otherwise set the bound)."""
    key_norms = k.norm(dim=-1).amax(dim=-1, keepdim=True)  # (B, H, 1)
    gain = scale * q.norm(dim=-1) * key_norms - lse  # (B, H, n): the most a row's bias can gain
    gain = gain.masked_fill(grad_out.abs().amax(dim=-1) == 0, float("-inf")).amax(dim=(0, 2))  # (H,)
    return anti_diagonals.masked_fill(anti_diagonals + gain[:, None] < -UNDERFLOW, float("-inf"))


def _hankel(anti_diagonals: torch.Tensor, start: int, end: int, first: int, last: int) -> torch.Tensor:
    """The (1, H, end - start, last - first) bias of queries start ... end - 1 and reversed key slots first ...
    last - 1: entry (r, c) is anti_diagonals[:, start + r + first + c], a view with unit strides, no copy."""
    heads, size = anti_diagonals.shape
    return anti_diagonals.as_strided(
        (1, heads, end - start, last - first), (0, size, 1, 1), anti_diagonals.storage_offset() + start + first
    )


def _classes(rows: torch.Tensor, cols: torch.Tensor, reach: int, causal: bool) -> torch.Tensor:
    """(rows, cols) table entries of each (query, key) pair; causal future keys take the extra -inf entry."""
    distance = cols[None, :] - rows[:, None]
    classes = distance.clamp(-reach, reach) + reach
    return classes.masked_fill(distance > 0, 2 * reach + 1) if causal else classes


def _table_grad(
    dtable, q, k, v, out, lse, grad_out, anti_diagonals, dk_part, start, end, offset, reach, causal, scale, dim
):
    """Add one query block's share of d table: sum over the batch and the block of dS by distance class.

    The band of keys within reach of the block takes dS explicitly (probabilities recomputed from the kept
    log-sum-exp); keys beyond it are in the end classes for every query of the block, so their share is their
    column sums of dS, which the extra channel's key gradient holds (dk'[..., dim] = scale * sum_i dS[i, j]).
    Keys are in reversed order: slot c is key length - 1 - c; dk_part covers the slots from `offset` on."""
    batch, heads, rows, channels = q.shape
    length = k.shape[2]
    lo, hi = max(0, start - reach + 1), min(length, end - 1 + reach)  # keys with a near distance to some row
    first, last = length - hi, length - lo  # their slots
    width, flat = hi - lo, batch * heads
    # P = exp(scale q k^T + bias - lse), dS = P * (dO v^T - rowsum(dO * O)), in 3-d GEMMs with the sums folded in
    base = (_hankel(anti_diagonals, start, end, first, last) - lse[..., None]).view(flat, rows, width)
    keys = k[:, :, first:last].reshape(flat, width, channels)
    probs = torch.baddbmm(base, q.view(flat, rows, channels), keys.mT, alpha=scale).exp_()
    delta = (grad_out * out).sum(-1, keepdim=True).view(flat, rows, 1)
    values = v[:, :, first:last].reshape(flat, width, channels)
    grad_scores = probs.mul_(torch.baddbmm(delta.neg_(), grad_out.view(flat, rows, channels), values.mT))
    grad_scores = grad_scores.view(batch, heads, rows, width).sum(0)  # (H, rows, width)
    classes = _classes(torch.arange(start, end), torch.arange(lo, hi).flip(0), reach, causal).flatten()
    dtable.index_add_(1, classes, grad_scores.flatten(1))
    column_sums = dk_part[..., dim].sum(0) / scale  # (H, slots from offset on)
    dtable[:, 0] += column_sums[:, last - offset :].sum(-1)  # keys before lo
    dtable[:, 2 * reach] += column_sums[:, : max(0, first - offset)].sum(-1)  # keys from hi on
