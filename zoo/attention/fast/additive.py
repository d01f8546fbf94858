"""Additive attention's scores on the CPU (`_AdditiveScores`): tanh through the logistic function, one (batch,
head) row and a cache-sized block of queries at a time, the backward in closed form, causal blocks without the keys
after their last query.

The fast path of zoo/attention/additive.py, whose reference forms tanh(q_i + k_j) for a block of queries with
torch.tanh and lets autograd differentiate it (recomputed under torch.utils.checkpoint); both are checked against
the formula written out per index in tests/attention/test_additive_attention.py, under both settings of the switch.

What makes it faster, with the same (T, S, head_dim) work:
- tanh(u) = 2 sigmoid(2u) - 1, and the CPU's vectorised sigmoid is several times faster than its tanh. With
  s = sigmoid(2q_i + 2k_j) the score is e_ij = 2 w . s - sum(w): the affine part costs one scalar per score, not a
  pass over the block.
- The backward needs no saved block and no autograd graph: with g = dL/de, 1 - tanh^2(u) = 4 s (1 - s), so
  dq_i = 4 w * sum_j g_ij s_ij (1 - s_ij), dk_j = 4 w * sum_i g_ij s_ij (1 - s_ij) and dw = sum_ij g_ij (2 s_ij - 1):
  each block is recomputed once and folded by two sums and one matrix-vector product, all in place.
- One (batch, head) row at a time, so w . s is a plain matrix-vector product (a batched one over rows of different
  heads is several times slower), and a block of BLOCK_ELEMENTS values stays in the core's cache across the passes.
- Causal with as many queries as keys or fewer (the queries are the last positions): a query block needs only
  the keys up to its last query; the scores after it are left 0, for the caller's mask.

The sigmoid form rounds differently from torch.tanh (by a few units in the last place of fp32; its largest error is
measured on experiments/results/additive_speed.md). Re-measure with `experiments/additive_speed.py`.
"""

from __future__ import annotations

import torch

# Values of one block's (queries, keys, head_dim) tensor when the kernel's chunk_size is not given: 1 MiB in fp32,
# about a core's L2 cache, where the block's passes run several times faster than on one that spills to memory;
# smaller blocks pay more Python per value (re-measure: experiments/additive_speed.py).
BLOCK_ELEMENTS = 1 << 18


# Fewer (queries x keys x head_dim) values per (batch, head) row than this take the reference path: the loop over
# rows costs some operator calls per row, more than the reference's few batched calls save on small rows (one
# decoding step, a short prompt); the study's training shapes have 2^17 and more. experiments/additive_speed.py's
# decoding table times both paths either side of it.
MIN_ROW_ELEMENTS = 1 << 14


def applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The fast path: CPU tensors in fp32 or fp64 (bf16/fp16 keep the reference's arithmetic), rows of at least
    MIN_ROW_ELEMENTS values."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and q.shape[2] * k.shape[2] * q.shape[3] >= MIN_ROW_ELEMENTS
    )


def additive_scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, causal: bool, block: int | None = None
) -> torch.Tensor:
    """e_ij = w_h . tanh(q_i + k_j): q (B, H, T, D), k (B, H, S, D), w (H, D) -> (B, H, T, S). causal: the keys
    after each query block's last query (query i sits at key i + S - T) are not computed, their scores 0 (the
    caller masks them). block: queries per block (None: the most whose block stays within BLOCK_ELEMENTS)."""
    return _AdditiveScores.apply(q, k, w, causal, block)


def query_blocks(length: int, keys: int, dim: int, causal: bool, block: int | None) -> list[tuple[int, int, int]]:
    """(first query, end query, end key) of each block of one row."""
    if block is None:
        block = max(1, BLOCK_ELEMENTS // max(1, keys * dim))
    offset = keys - length  # causal: query i sits at key position i + offset
    return [(t0, min(t0 + block, length), min(keys, offset + t0 + block) if causal else keys)
            for t0 in range(0, length, block)]  # fmt: skip


class _AdditiveScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, causal: bool, block: int | None):
        batch, heads, length, dim = q.shape
        keys = k.shape[2]
        rows = batch * heads
        q2, k2 = (2 * q).reshape(rows, length, dim), (2 * k).reshape(rows, keys, dim)
        w_rows = w.expand(batch, heads, dim).reshape(rows, dim)
        w_sums = w_rows.sum(-1).tolist()
        scores = q.new_zeros(rows, length, keys)
        ctx.blocks = blocks = query_blocks(length, keys, dim, causal, block)
        for n in range(rows):
            for t0, t1, s1 in blocks:
                s = torch.add(q2[n, t0:t1, None, :], k2[n, None, :s1, :]).sigmoid_()  # (t, s1, D)
                part = torch.mv(s.view(-1, dim), w_rows[n]).view(t1 - t0, s1)
                scores[n, t0:t1, :s1] = part.mul_(2.0).sub_(w_sums[n])
        ctx.save_for_backward(q2, k2, w_rows)
        ctx.shape = (batch, heads, length, keys, dim)
        return scores.view(batch, heads, length, keys)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q2, k2, w_rows = ctx.saved_tensors
        batch, heads, length, keys, dim = ctx.shape
        rows = batch * heads
        grad = grad.reshape(rows, length, keys)
        dq, dk = torch.zeros_like(q2), torch.zeros_like(k2)
        dw = w_rows.new_zeros(rows, dim)
        for n in range(rows):
            for t0, t1, s1 in ctx.blocks:
                g = grad[n, t0:t1, :s1]
                s = torch.add(q2[n, t0:t1, None, :], k2[n, None, :s1, :]).sigmoid_()
                g_flat = g.reshape(-1)
                dw[n].addmv_(s.view(-1, dim).T, g_flat, alpha=2.0).sub_(g_flat.sum())
                s.addcmul_(s, s, value=-1.0).mul_(g.unsqueeze(-1))  # g_ij s_ij (1 - s_ij)
                dq[n, t0:t1] = s.sum(1)
                dk[n, :s1] += s.sum(0)
        four_w = 4.0 * w_rows.unsqueeze(1)
        dq = dq.mul_(four_w).view(batch, heads, length, dim)
        dk = dk.mul_(four_w).view(batch, heads, keys, dim)
        return dq, dk, dw.view(batch, heads, dim).sum(0), None, None
