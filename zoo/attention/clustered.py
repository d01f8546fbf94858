"""Attention within content clusters, chunked: the machinery of routing (zoo/attention/routing.py) and LSH
(zoo/attention/lsh.py) attention.

Given a cluster id per token (a k-means centroid, an LSH bucket), the tokens of each cluster are taken in
position order and cut into chunks of `chunk` tokens (rank r of a cluster's run sits in its chunk r // chunk).
Query i attends to key j when both are in one cluster and j's chunk of that cluster is i's or the one before
(Reformer's "attend to the own and the previous chunk", Kitaev et al. 2020, section 2, taken per cluster):

    allowed(i, j) = c_i == c_j  and  rank_j // chunk in {rank_i // chunk, rank_i // chunk - 1}  (and j <= i causal)

A rank counts only earlier tokens, so the pattern of query i depends on tokens up to i: causal attention stays
causal (a sort of the whole sequence cut into chunks would let later tokens move earlier ones between chunks)
and a decoded token sees what the whole-sequence forward gives it. Every chunk holds at most `chunk` tokens,
so the cost is O(n chunk) however unbalanced the clusters; each cluster's run is padded to whole chunks (at
most one partial chunk per cluster: n / chunk + clusters chunks in all).

Computed with public ops: a sort by (cluster, position) gives each token its slot in the padded runs, a
gather lays queries, keys and values out by slot, one batched matmul per (chunk, its keys: previous + own),
and a gather of the slots brings the outputs (and log-sum-exps, for LSH's rounds) back to token order.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from zoo.attention.contract import ScoreBias


def cluster_slots(clusters: torch.Tensor, num_clusters: int, chunk: int) -> tuple[torch.Tensor, int]:
    """(N, n) cluster ids in [0, num_clusters) -> each token's slot (N, n) in the clusters' runs padded to whole
    chunks, and the number of slots (a bound for every row: (ceil(n / chunk) + num_clusters) * chunk)."""
    rows, length = clusters.shape
    positions = torch.arange(length, device=clusters.device)
    order = (clusters * length + positions).argsort(dim=-1)  # tokens by (cluster, position)
    sorted_clusters = clusters.gather(1, order)
    counts = torch.zeros(rows, num_clusters, dtype=torch.long, device=clusters.device)
    counts.scatter_add_(1, clusters, torch.ones_like(clusters))
    run_start = counts.cumsum(dim=1) - counts  # first sorted index of each cluster
    chunk_start = (-(-counts // chunk)).cumsum(dim=1) - (-(-counts // chunk))  # first chunk of each cluster
    rank = positions - run_start.gather(1, sorted_clusters)
    slot_sorted = (chunk_start.gather(1, sorted_clusters) + rank // chunk) * chunk + rank % chunk
    slots = torch.empty_like(clusters).scatter_(1, order, slot_sorted)
    return slots, (-(-length // chunk) + num_clusters) * chunk


def cluster_ranks(clusters: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """(N, n) -> (N, n): how many earlier tokens share each token's cluster (dense sizes: an (N, n, C) count)."""
    one_hot = F.one_hot(clusters, num_clusters)
    return (one_hot.cumsum(dim=1) - one_hot).gather(2, clusters[..., None])[..., 0]


def dense_cluster_mask(clusters: torch.Tensor, num_clusters: int, chunk: int, q_len: int, causal: bool):
    """(N, n) cluster ids -> (N, q_len, n) bool: the pattern above for the last q_len tokens as queries."""
    length = clusters.shape[1]
    block = cluster_ranks(clusters, num_clusters) // chunk
    query_clusters, query_blocks = clusters[:, length - q_len :, None], block[:, length - q_len :, None]
    allowed = (query_clusters == clusters[:, None, :]) & (
        (block[:, None, :] == query_blocks) | (block[:, None, :] == query_blocks - 1)
    )
    if causal:
        allowed = allowed & torch.ones(q_len, length, dtype=torch.bool, device=clusters.device).tril(length - q_len)
    return allowed


def exclude_self(allowed: torch.Tensor, is_self: torch.Tensor) -> torch.Tensor:
    """Reformer's rule: a token attends to itself only when no other key is allowed."""
    others = allowed & ~is_self
    return others | (allowed & is_self & ~others.any(dim=-1, keepdim=True))


def _head_bias(bias: ScoreBias, query_positions: torch.Tensor, key_positions: torch.Tensor, heads: int):
    """The bias of head h for row (b, h) of positions (B * H, ..., Tq), (B * H, ..., Tk) -> (B * H, ..., Tq, Tk)."""
    values = bias(query_positions, key_positions)  # (B * H, ..., H, Tq, Tk)
    values = values.unflatten(0, (-1, heads))  # (B, H, ..., H, Tq, Tk)
    values = torch.diagonal(values, dim1=1, dim2=values.ndim - 3)  # (B, ..., Tq, Tk, H)
    return values.movedim(-1, 1).flatten(0, 1)


def clustered_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    clusters: torch.Tensor,
    num_clusters: int,
    chunk: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    bias: ScoreBias | None = None,
    no_self: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, n, D) (heads already expanded), clusters (B, H, n) -> out (B, H, n, D) and the log-sum-exp
    of each query's scores (B, H, n; -inf where it has no key, and its output is zero). `no_self`: Reformer's rule
    (a token attends to itself only when nothing else is allowed)."""
    batch, heads, length, dim = q.shape
    rows = batch * heads
    slots, total = cluster_slots(clusters.reshape(rows, length), num_clusters, chunk)
    token_at = torch.full((rows, total), -1, dtype=torch.long, device=q.device)
    token_at.scatter_(1, slots, torch.arange(length, device=q.device).expand(rows, length))
    index = token_at.clamp(min=0)

    def lay_out(x: torch.Tensor) -> torch.Tensor:  # (B, H, n, D) -> (N, chunks, chunk, D) by slot
        x = x.reshape(rows, length, x.shape[-1])
        return x.gather(1, index[..., None].expand(rows, total, x.shape[-1])).view(rows, -1, chunk, x.shape[-1])

    def with_previous(x: torch.Tensor, fill) -> torch.Tensor:  # (N, M, C, ...) -> (N, M, 2C, ...)
        previous = torch.cat([torch.full_like(x[:, :1], fill), x[:, :-1]], dim=1)
        return torch.cat([previous, x], dim=2)

    queries, keys, values = lay_out(q), with_previous(lay_out(k), 0.0), with_previous(lay_out(v), 0.0)
    query_positions = token_at.view(rows, -1, chunk)  # (N, M, C), -1: an empty slot
    key_positions = with_previous(query_positions, -1)  # (N, M, 2C)
    cluster_of = clusters.reshape(rows, length).gather(1, index).masked_fill(token_at < 0, -1).view(rows, -1, chunk)
    key_clusters = with_previous(cluster_of, -1)
    allowed = (key_clusters[:, :, None, :] == cluster_of[..., None]) & (key_positions >= 0)[:, :, None, :]
    if causal:
        allowed = allowed & (key_positions[:, :, None, :] <= query_positions[..., None])
    if key_padding_mask is not None:
        padded = key_padding_mask.bool()[:, None, :].expand(batch, heads, length).reshape(rows, length)
        allowed = (
            allowed & ~padded.gather(1, key_positions.clamp(min=0).flatten(1)).view(key_positions.shape)[:, :, None, :]
        )
    if no_self:
        allowed = exclude_self(allowed, key_positions[:, :, None, :] == query_positions[..., None])
    scores = queries @ keys.transpose(-2, -1) * (1.0 / math.sqrt(dim))  # (N, M, C, 2C)
    if bias is not None:
        scores = scores + _head_bias(bias, query_positions.clamp(min=0), key_positions.clamp(min=0), heads).to(
            scores.dtype
        )
    has_key = allowed.any(dim=-1, keepdim=True)
    # Rows without keys are unmasked before the log-sum-exp and zeroed after: no NaN in values or gradients.
    scores = scores.masked_fill(~(allowed | ~has_key), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).masked_fill(~has_key, 0.0)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    out = (probs @ values).view(rows, total, dim)
    lse = lse.masked_fill(~has_key, float("-inf")).view(rows, total)
    out = out.gather(1, slots[..., None].expand(rows, length, dim)).view(batch, heads, length, dim)
    return out, lse.gather(1, slots).view(batch, heads, length)


def dense_clustered_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    clusters: torch.Tensor,
    num_clusters: int,
    chunk: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    bias: ScoreBias | None = None,
    no_self: bool = False,
    start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same attention through the dense (T, S) mask: q (B, H, T, D) the last T of S tokens (decoding), k, v
    (B, H, S, D), clusters (B, H, S) -> out (B, H, T, D), the probabilities (B, H, T, S) (need_weights) and the
    log-sum-exp (B, H, T). `start`: the position of the first key (for the bias). For small inputs."""
    batch, heads, q_len, dim = q.shape
    length = k.shape[2]
    allowed = dense_cluster_mask(clusters.flatten(0, 1), num_clusters, chunk, q_len, causal).view(
        batch, heads, q_len, length
    )
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask.bool()[:, None, None, :]
    if no_self:
        positions = torch.arange(length, device=q.device)
        allowed = exclude_self(allowed, positions[length - q_len :, None] == positions[None, :])
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(dim))
    if bias is not None:
        positions = torch.arange(start, start + length, device=q.device)
        scores = scores + bias(positions[length - q_len :], positions).to(scores.dtype)
    has_key = allowed.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~(allowed | ~has_key), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).masked_fill(~has_key, 0.0)
    dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0.0 else probs
    return dropped @ v, probs, lse.masked_fill(~has_key, float("-inf"))[..., 0]
