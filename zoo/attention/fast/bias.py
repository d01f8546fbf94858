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

T5 at lengths well past its reach (`_BandAndEnds`, length >= SPLIT_FROM * M): beyond the band |j - i| < M the bias
is one value per side, a constant that a softmax over a region absorbs. So the attention is three parts merged by
their log-sum-exps: the keys j <= i - M (a causal flash call on q[M:] and k[:n - M], no mask at all), the keys
j >= i + M (the same on the reversed sequence; bidirectional only), and the band, computed explicitly in query
blocks of BAND_BLOCK rows. The backward gives each flash call the merged output and log-sum-exp, which makes its
probabilities the whole attention's (less the constant), so dq, dk, dv are the parts' sums; the band's dS is
explicit, which gives the table's near classes, and the end classes follow from sum_j dS[i, j] = 0 for each row:
causal, d table[left end] = -(everything in the band); bidirectional, the left end's sum of dS is
sum_j dv_left[j] . v[j] - sum_i P(left | i) delta_i (the left call's value gradient and log-sum-exp), and the right end
takes the rest.
"""

from __future__ import annotations

import torch

from zoo.attention.biases import ALiBi, T5RelativeBias, constant_beyond, distance_table
from zoo.attention.fast.blocks import merge_into
from zoo.attention.functional import additive_mask

PADDED = -1e30  # the extra key channel of a padded key: exp underflows to exactly 0 after the softmax's shift
# fp32 backward: bias entries whose probability is surely below exp(-UNDERFLOW) count as -inf (their share of any
# sum lies some 15 orders below fp32's resolution); left in, products of such tiny probabilities turn denormal, and
# denormal arithmetic slows the kernel's backward several times (ALiBi's far keys, any strongly negative bias).
UNDERFLOW = 50.0
# causal: query blocks of this many rows see only the keys up to their end, which spares the kernel the masked
# upper triangle (it skips masked tiles only for is_causal, which takes no bias)
CAUSAL_BLOCK = 256
BLOCK_ELEMENTS = 2**18  # learned-table backward: query blocks of H * block * n scores at most, at least 64 rows
# T5 takes the band-and-ends split from this many times its reach on, causal and bidirectional (below it the band is
# most of the matrix and the blocks above are faster; bidirectional attention has two ends and a band twice as wide),
# its band in query blocks of BAND_BLOCK rows; crossover and block: experiments/results/position_bias_speed.md
SPLIT_FROM = {True: 4, False: 12}
BAND_BLOCK = 64


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
    kernel = _BandAndEnds if length > reach and length >= SPLIT_FROM[causal] * reach else _RelativeBiasAttention
    with torch.autocast("cpu", enabled=False):
        out = kernel.apply(q.to(compute), k.to(compute), v.to(compute), table.to(compute), padding, causal, reach)
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
        anti_diagonals = _anti_diagonals(table, length, reach, causal)
        if q.dtype == torch.float32:
            anti_diagonals = _without_underflow(anti_diagonals, q[..., :dim], k[..., :dim], lse, grad_out, scale)
        learned = ctx.needs_input_grad[3]
        if learned:
            block = _block_size(heads, length)
        else:
            block = CAUSAL_BLOCK if causal else length
        dq, dk, dv = torch.empty_like(q), None, None
        dtable = table.new_zeros(heads, table.shape[1] + 1) if learned else None  # + the causal entry
        # the last block first: it sees every key (first slot 0), and its key gradients become the sums the other
        # blocks add to, so that no zero-filled copies of dk and dv are held beside the kernel's
        for start, end, first in reversed(list(_blocks(length, block, causal))):
            q_block, out_block, lse_block, grad_block = (
                t[:, :, start:end].contiguous() for t in (q, out, lse, grad_out)
            )
            dq_block, dk_part, dv_part = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_block, q_block, k[:, :, first:], v[:, :, first:], out_block, lse_block, 0.0, False,
                attn_mask=_hankel(anti_diagonals, start, end, first, length), scale=scale,
            )  # fmt: skip
            dq[:, :, start:end] = dq_block
            if dk is None:
                dk, dv = dk_part, dv_part
            else:
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
    silent = torch.linalg.vector_norm(grad_out, float("inf"), dim=-1) == 0
    gain = gain.masked_fill(silent, float("-inf")).amax(dim=(0, 2))  # (H,)
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


class _BandAndEnds(torch.autograd.Function):
    """T5 as the band |j - i| < M (explicit) and its two ends (constant bias: flash calls without a mask), merged
    by log-sum-exp (see the module's docstring). Saves q, k, v, the output and its log-sum-exp (bidirectional: also
    the left end's log-sum-exp, for its share of the table's gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, table, padding, causal, reach):
        length = q.shape[2]
        scale = q.shape[-1] ** -0.5
        out, lse = _band_forward(q, k, v, table, padding, causal, reach, scale)
        # the ends' rows: the left end's are M ... n - 1, the right end's (bidirectional) 0 ... n - M - 1
        ends = [(slice(reach, length), *_end_forward(q, k, v, table[:, 0], padding, reach, scale))]
        if not causal:
            right = _end_forward(*_reversed(q, k, v), table[:, -1], _reversed_padding(padding), reach, scale)
            ends.append((slice(0, length - reach), *_reversed(*right)))
        for rows, part_out, part_lse in ends:
            merge_into(out[:, :, rows], lse[:, :, rows], part_out, part_lse)
        lse.clamp_(min=PADDED)  # rows that see no key at all: the backward's probabilities exp(-inf - PADDED) = 0
        ctx.save_for_backward(q, k, v, table, out, lse, *([] if causal else ends[0][2:]))  # + the left end's lse
        ctx.settings = (padding, causal, reach, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse, *left_lse = ctx.saved_tensors
        padding, causal, reach, scale = ctx.settings
        # the ends' gradients: the left end's cover rows M ... n - 1 (dq) and keys 0 ... n - M - 1 (dk, dv), the right
        # end's (bidirectional) rows 0 ... n - M - 1 and keys M ... n - 1. The right end first, while no whole-sequence
        # gradient is held beside its reversed inputs; each padded to n rows only after its kernel call has returned
        length = q.shape[2]
        learned = ctx.needs_input_grad[3]
        delta = (grad_out * out).sum(-1)  # (B, H, n)
        if causal:
            dq, dk, dv = _end_backward(grad_out, q, k, v, out, lse, table[:, 0], padding, reach, scale)
            # one at a time, each partial freed as its padded copy replaces it
            dq = torch.nn.functional.pad(dq, (0, 0, reach, 0))
            dk = torch.nn.functional.pad(dk, (0, 0, 0, reach))
            dv = torch.nn.functional.pad(dv, (0, 0, 0, reach))
        else:
            dq, dk, dv = _end_backward(*_reversed(grad_out, q, k, v, out, lse), table[:, -1],
                                       _reversed_padding(padding), reach, scale)  # fmt: skip
            dq = torch.nn.functional.pad(dq.flip(2), (0, 0, 0, reach))
            dk = torch.nn.functional.pad(dk.flip(2), (0, 0, reach, 0))
            dv = torch.nn.functional.pad(dv.flip(2), (0, 0, reach, 0))
            left_dq, left_dk, left_dv = _end_backward(grad_out, q, k, v, out, lse, table[:, 0], padding, reach, scale)
            dq[:, :, reach:] += left_dq
            dk[:, :, : length - reach] += left_dk
            dv[:, :, : length - reach] += left_dv
            if learned:  # sum of dS over the left end: sum P dP (= sum_j dv_j . v_j) less sum_i P(left | i) delta_i
                left_share = (left_dv * v[:, :, : length - reach]).sum((0, 2, 3))
                left_share -= ((left_lse[0] - lse[:, :, reach:]).exp_() * delta[:, :, reach:]).sum((0, 2))
            del left_dq, left_dk, left_dv
        dtable = _band_backward(grad_out, q, k, v, lse, delta, table, padding, causal, reach, scale, dq, dk, dv,
                                learned)  # fmt: skip
        if learned:
            band = dtable.sum(-1)  # the near classes only: the ends are still 0
            if causal:
                dtable[:, 0] = -band
            else:
                dtable[:, 0] = left_share
                dtable[:, -1] = -band - left_share
        return dq, dk, dv, dtable, None, None, None


def _reversed(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors (B, H, n, ...) in reversed sequence order: the right end is the left end of the reversed sequence."""
    return tuple(t.flip(2) for t in tensors)


def _reversed_padding(padding: torch.Tensor | None) -> torch.Tensor | None:
    return None if padding is None else padding.flip(1)


def _key_mask(padding: torch.Tensor | None, keys: int, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, 1, 1, keys) additive mask of the first `keys` keys' padding, broadcast by the flash kernel."""
    return None if padding is None else additive_mask(~padding[:, None, None, :keys], dtype)


def _end_forward(q, k, v, end_bias, padding, reach, scale):
    """The keys j <= i - M with their one bias value, for the rows M ... n - 1: (B, H, n - M, D) output and
    (B, H, n - M) log-sum-exp, -inf for the rows whose keys there are all padding."""
    keys = q.shape[2] - reach
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[:, :, reach:], k[:, :, :keys], v[:, :, :keys], is_causal=True,
        attn_mask=_key_mask(padding, keys, q.dtype), scale=scale,
    )  # fmt: skip
    lse += end_bias[:, None]
    if padding is not None:  # the kernel gives a row without keys log-sum-exp 0
        seen = (~padding[:, :keys]).cummax(dim=1).values
        lse.masked_fill_(~seen[:, None, :], float("-inf"))
    return out, lse


def _end_backward(grad_out, q, k, v, out, lse, end_bias, padding, reach, scale):
    """dq (rows M ... n - 1), dk, dv (keys 0 ... n - M - 1) of the keys j <= i - M: the flash backward with the whole
    attention's output and log-sum-exp (less the end's bias, which the kernel does not add), whose probabilities then
    are the whole attention's."""
    keys = q.shape[2] - reach
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out[:, :, reach:], q[:, :, reach:], k[:, :, :keys], v[:, :, :keys], out[:, :, reach:],
        lse[:, :, reach:] - end_bias[:, None], 0.0, True, attn_mask=_key_mask(padding, keys, q.dtype), scale=scale,
    )  # fmt: skip


def _band(table, reach, causal, length):
    """The band's blocks and bias: (H, BAND_BLOCK, width) bias of block row r and key offset c (key s - M + 1 + c),
    -inf outside the band, its classes, and (start, end, first key, end key, offset of the first key) per block."""
    width = BAND_BLOCK + (reach - 1 if causal else 2 * reach - 2)
    distance = torch.arange(width)[None, :] - (reach - 1) - torch.arange(BAND_BLOCK)[:, None]
    outside = (distance.abs() >= reach) | (distance > 0 if causal else False)
    classes = distance.clamp(-reach + 1, reach - 1) + reach
    bias = table[:, classes].masked_fill(outside, float("-inf"))
    blocks = []
    for start in range(0, length, BAND_BLOCK):
        end = min(start + BAND_BLOCK, length)
        first = max(0, start - reach + 1)
        last = end if causal else min(length, end + reach - 1)
        blocks.append((start, end, first, last, first - (start - reach + 1)))
    return bias, classes, blocks


def _band_scores(q, k, bias, padding, start, end, first, last, offset, scale):
    scores = torch.matmul(q[:, :, start:end], k[:, :, first:last].mT).mul_(scale)
    scores += bias[:, : end - start, offset : offset + last - first]
    if padding is not None:
        scores.masked_fill_(padding[:, None, None, first:last], float("-inf"))
    return scores


def _band_forward(q, k, v, table, padding, causal, reach, scale):
    """The band |j - i| < M: (B, H, n, D) output and (B, H, n) log-sum-exp, block by block."""
    bias, _, blocks = _band(table, reach, causal, q.shape[2])
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for start, end, first, last, offset in blocks:
        scores = _band_scores(q, k, bias, padding, start, end, first, last, offset, scale)
        peak = scores.amax(-1, keepdim=True).clamp_(min=PADDED)  # a row of padding only: exp(-inf) = 0
        probs = scores.sub_(peak).exp_()
        total = probs.sum(-1, keepdim=True)
        out[:, :, start:end] = torch.matmul(probs, v[:, :, first:last]).div_(total.clamp(min=torch.finfo(q.dtype).tiny))
        lse[:, :, start:end] = (peak + total.log()).squeeze(-1)
    return out, lse


def _band_backward(grad_out, q, k, v, lse, delta, table, padding, causal, reach, scale, dq, dk, dv, learned):
    """Add the band's share to dq, dk, dv; returns the table's gradient over the band's classes (ends 0)."""
    bias, classes, blocks = _band(table, reach, causal, q.shape[2])
    dtable = torch.zeros_like(table) if learned else None
    for start, end, first, last, offset in blocks:
        scores = _band_scores(q, k, bias, padding, start, end, first, last, offset, scale)
        probs = scores.sub_(lse[:, :, start:end, None]).exp_()
        grad_block = grad_out[:, :, start:end]
        grad_scores = torch.matmul(grad_block, v[:, :, first:last].mT).sub_(delta[:, :, start:end, None]).mul_(probs)
        dv[:, :, first:last] += torch.matmul(probs.mT, grad_block)
        dq[:, :, start:end] += torch.matmul(grad_scores, k[:, :, first:last]).mul_(scale)
        dk[:, :, first:last] += torch.matmul(grad_scores.mT, q[:, :, start:end]).mul_(scale)
        if learned:
            block_classes = classes[: end - start, offset : offset + last - first]
            dtable.index_add_(1, block_classes.flatten(), grad_scores.sum(0).flatten(1))
    return dtable
