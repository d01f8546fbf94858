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
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel, ScoreBias
from zoo.attention.fast import clustered as fast_clustered
from zoo.attention.fast import use_fast_kernels
from zoo.attention.functional import fill_rows_


def cluster_slots(clusters: torch.Tensor, num_clusters: int, chunk: int) -> tuple[torch.Tensor, int, int]:
    """(N, n) cluster ids in [0, num_clusters) -> each token's slot (N, n) in the clusters' runs padded to whole
    chunks, the number of slots (the most any row needs, at most (ceil(n / chunk) + num_clusters) * chunk) and
    the chunk length used.

    The chunk used is `chunk`, or the largest cluster's size where that is smaller: a chunk at least as long as
    every cluster holds its cluster whole and its previous chunk is another cluster's, so the pattern is "the
    whole own cluster" at any such length. Shrinking it changes no score and makes a sequence shorter than a
    chunk cost about n * largest cluster, not clusters * chunk^2 (LSH's default 64-token chunks over ViT's 17
    tokens; measured in experiments/results/content_attention.md, per task in the variant study's cost table)."""
    rows, length = clusters.shape
    positions = torch.arange(length, device=clusters.device)
    order = (clusters * length + positions).argsort(dim=-1)  # tokens by (cluster, position)
    sorted_clusters = clusters.gather(1, order)
    counts = torch.zeros(rows, num_clusters, dtype=torch.long, device=clusters.device)
    counts.scatter_add_(1, clusters, torch.ones_like(clusters))
    chunk = min(chunk, max(1, int(counts.max())))  # one host sync
    run_start = counts.cumsum(dim=1) - counts  # first sorted index of each cluster
    chunk_start = (-(-counts // chunk)).cumsum(dim=1) - (-(-counts // chunk))  # first chunk of each cluster
    rank = positions - run_start.gather(1, sorted_clusters)
    slot_sorted = (chunk_start.gather(1, sorted_clusters) + rank // chunk) * chunk + rank % chunk
    slots = torch.empty_like(clusters).scatter_(1, order, slot_sorted)
    chunks = int((-(-counts // chunk)).sum(dim=1).max())  # the most any row needs (one host sync)
    return slots, chunks * chunk, chunk


def cluster_ranks(clusters: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """(N, n) -> (N, n): how many earlier tokens share each token's cluster (dense sizes: an (N, n, C) count)."""
    one_hot = F.one_hot(clusters, num_clusters)
    return (one_hot.cumsum(dim=1) - one_hot).gather(2, clusters[..., None])[..., 0]


def dense_cluster_mask(
    clusters: torch.Tensor, num_clusters: int, chunk: int, q_len: int, causal: bool, across_clusters: bool = False
):
    """(N, n) cluster ids -> (N, q_len, n) bool: the pattern above for the last q_len tokens as queries
    (`across_clusters`: and a cluster's first chunk sees the previous cluster's first chunk whole)."""
    length = clusters.shape[1]
    block = cluster_ranks(clusters, num_clusters) // chunk
    query_clusters, query_blocks = clusters[:, length - q_len :, None], block[:, length - q_len :, None]
    allowed = (query_clusters == clusters[:, None, :]) & (
        (block[:, None, :] == query_blocks) | (block[:, None, :] == query_blocks - 1)
    )
    if across_clusters:
        previous = (query_clusters - 1) % num_clusters
        allowed = allowed | (
            (query_blocks == 0)
            & (previous != query_clusters)
            & (clusters[:, None, :] == previous)
            & (block[:, None, :] == 0)
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


@dataclass(eq=False)
class Chunks:
    """Tokens laid out by cluster in chunks (`chunk_layout`): N = B * H rows of M chunks of C slots. The queries,
    keys and values are laid out on first use (a path that lays them out itself reads only the indices)."""

    key_mask: torch.Tensor  # (N, M, 2C) additive: the keys each chunk may use (-inf: empty, padded, other cluster)
    has_key: torch.Tensor  # (N, M, C): the slot's query sees at least one key (an empty slot sees none)
    self_blocked: torch.Tensor | None  # (N, M, C): no_self's rule hides the query's own key
    previous_tokens: torch.Tensor  # (N, M, C): the token at each key slot of the previous chunk, -1 where none
    previous_later: torch.Tensor | None  # (N, M, C, C): causal across clusters, a previous key after the query
    token_at: torch.Tensor  # (N, M * C): the token in each slot, -1 where empty
    slots: torch.Tensor  # (N, n): each token's slot
    shape: torch.Size  # q's (B, H, n, D)
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q, k, v (B, H, n, D)
    flat: torch.Tensor  # (N * M * C,): each slot's row of the (N * n, D) tokens (token 0's where empty)
    key_slots: torch.Tensor | None  # (N * M * 2C,) across clusters: each chunk's key rows (N * n: a zero row)

    @cached_property
    def queries(self) -> torch.Tensor:  # (N * M, C, D)
        q = self.inputs[0]
        return q.reshape(-1, q.shape[-1]).index_select(0, self.flat).view(-1, self.key_mask.shape[-1] // 2, q.shape[-1])

    @cached_property
    def keys(self) -> torch.Tensor:  # (N * M, 2C, D): the previous chunk's and the own (strided views)
        return self._with_previous(self.inputs[1])

    @cached_property
    def values(self) -> torch.Tensor:  # (N * M, 2C, D)
        return self._with_previous(self.inputs[2])

    def _with_previous(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, n, D) -> (N * M, 2C, D): previous + own
        # Every row's slots in one flat list of tokens (an index_select of whole vectors: faster than gather),
        # after one chunk of a zero row, so that each chunk's keys (the previous chunk and its own) are a strided
        # window of the laid-out keys, not a copy. The first chunk of a row sees the previous row's last chunk
        # there: masked.
        chunk, dim = self.key_mask.shape[-1] // 2, x.shape[-1]
        x = F.pad(x.reshape(-1, dim), (0, 0, 0, 1))  # row N * n: zeros
        if self.key_slots is not None:
            return x.index_select(0, self.key_slots).view(-1, 2 * chunk, dim)
        flat_with_zeros = torch.cat([torch.full((chunk,), x.shape[0] - 1, device=x.device), self.flat])
        return x.index_select(0, flat_with_zeros).unfold(0, 2 * chunk, chunk).transpose(1, 2)


def chunk_layout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    clusters: torch.Tensor,
    num_clusters: int,
    chunk: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    no_self: bool = False,
    across_clusters: bool = False,
) -> Chunks:
    """q, k, v (B, H, n, D), clusters (B, H, n) -> the chunks and which keys each may use (`Chunks`).

    `across_clusters`: a cluster's first chunk takes as its previous chunk the first chunk of cluster c - 1 (mod
    the clusters), all of whose keys it sees (LSH's chunk_keys=chunk, zoo/attention/lsh.py); the keys are then
    gathered per chunk, not a strided window."""
    batch, heads, length, dim = q.shape
    rows = batch * heads
    slots, total, chunk = cluster_slots(clusters.reshape(rows, length), num_clusters, chunk)
    token_at = torch.full((rows, total), -1, dtype=torch.long, device=q.device)
    token_at.scatter_(1, slots, torch.arange(length, device=q.device).expand(rows, length))
    index = token_at.clamp(min=0)
    flat = (index + length * torch.arange(rows, device=q.device)[:, None]).flatten()
    real = (token_at >= 0).view(rows, -1, chunk)  # (N, M, C)
    usable = real
    if key_padding_mask is not None:
        padded = key_padding_mask.bool()[:, None, :].expand(batch, heads, length).reshape(rows, length)
        usable = real & ~padded.gather(1, index).view(real.shape)
    chunk_cluster = clusters.reshape(rows, length).gather(1, index[:, ::chunk])  # (N, M): a chunk's one cluster
    same_as_previous = torch.zeros_like(real[..., 0])
    same_as_previous[:, 1:] = (chunk_cluster[:, 1:] == chunk_cluster[:, :-1]) & real[:, :-1, 0]
    blocks = real.shape[1]
    if across_clusters:
        previous = _previous_chunks(
            clusters.reshape(rows, length), num_clusters, chunk, chunk_cluster, same_as_previous
        )
        previous = previous.masked_fill(~real[..., 0], -1)  # (N, M): the previous chunk's index, -1 where none
    else:
        previous = torch.arange(-1, blocks - 1, device=q.device).expand(rows, blocks).masked_fill(~same_as_previous, -1)
    has_previous = (previous >= 0)[..., None]
    previous_index = previous.clamp(min=0)[..., None].expand(rows, blocks, chunk)
    previous_usable = usable.gather(1, previous_index) & has_previous
    query_tokens = token_at.view(rows, blocks, chunk)
    if across_clusters:
        previous_tokens = query_tokens.gather(1, previous_index).masked_fill(~has_previous, -1)
    else:  # the previous slots whatever their cluster (as the strided window lays them out), for the bias
        previous_tokens = torch.cat([torch.full_like(query_tokens[:, :1], -1), query_tokens[:, :-1]], dim=1)
    # Keys a query may see: the previous chunk's usable ones (before it, when causal: across clusters the
    # previous chunk is another cluster's, whose tokens may come later), and its own chunk's (up to itself).
    previous_later = None
    if causal and across_clusters:
        previous_later = previous_tokens[:, :, None, :] > query_tokens[:, :, :, None]
        previous_count = (previous_usable[:, :, None, :] & ~previous_later).sum(dim=-1)
    else:
        previous_count = previous_usable.sum(dim=-1, keepdim=True)
    own = usable.cumsum(dim=-1) if causal else usable.sum(dim=-1, keepdim=True).expand(usable.shape)
    count = previous_count + own  # (N, M, C), itself included when usable
    self_blocked = None
    if no_self:
        others = count - usable.long()
        self_blocked = usable & (others > 0)
        count = count - self_blocked.long()
    key_mask = torch.zeros(rows, real.shape[1], 2 * chunk, dtype=q.dtype, device=q.device)
    key_mask.masked_fill_(~torch.cat([previous_usable, usable], dim=-1), float("-inf"))
    key_slots = None
    if across_clusters:  # the previous chunk is not always the one before in the layout: gathered per chunk
        own_slots = flat.view(rows, blocks, chunk)
        previous_slots = own_slots.gather(1, previous_index).masked_fill(~has_previous, rows * length)  # zero row
        key_slots = torch.cat([previous_slots, own_slots], dim=-1).flatten()
    return Chunks(
        key_mask,
        count > 0,
        self_blocked,
        previous_tokens,
        previous_later,
        token_at,
        slots,
        q.shape,
        (q, k, v),
        flat,
        key_slots,
    )


def _previous_chunks(clusters, num_clusters, chunk, chunk_cluster, same_as_previous) -> torch.Tensor:
    """(N, M): the previous chunk of each chunk across clusters: the one before it in its cluster, or, for a
    cluster's first chunk, the first chunk of cluster c - 1 (mod the clusters); -1 where that cluster is empty."""
    rows = clusters.shape[0]
    counts = torch.zeros(rows, num_clusters, dtype=torch.long, device=clusters.device)
    counts.scatter_add_(1, clusters, torch.ones_like(clusters))
    chunks = -(-counts // chunk)
    first_chunk = chunks.cumsum(dim=1) - chunks  # (N, clusters)
    before = (chunk_cluster - 1) % num_clusters
    usable = (counts.gather(1, before) > 0) & (before != chunk_cluster)
    own_previous = torch.arange(-1, chunk_cluster.shape[1] - 1, device=clusters.device).expand_as(chunk_cluster)
    across = torch.where(usable, first_chunk.gather(1, before), -1)
    return torch.where(same_as_previous, own_previous, across)


def chunk_mask(chunks: Chunks, *, causal: bool, bias: ScoreBias | None = None) -> torch.Tensor:
    """The additive (N, M, C, 2C) mask of each chunk's queries over its keys: the usable keys, the causal triangle
    in the own chunk, no_self's hidden own keys, and the position bias; rows without a key are 0 (finite scores,
    their outputs are zeroed by `to_tokens`)."""
    rows, blocks, width = chunks.key_mask.shape
    chunk = width // 2
    mask = chunks.key_mask[:, :, None, :].expand(rows, blocks, chunk, width)
    if causal:
        triangle = torch.ones(chunk, chunk, dtype=torch.bool, device=mask.device).tril()
        structure = torch.zeros(chunk, width, dtype=mask.dtype, device=mask.device)
        structure[:, chunk:].masked_fill_(~triangle, float("-inf"))
        mask = mask + structure
    else:
        mask = mask.clone()
    if chunks.previous_later is not None:
        mask[..., :chunk].masked_fill_(chunks.previous_later, float("-inf"))
    if chunks.self_blocked is not None:
        mask[..., chunk:].diagonal(dim1=-2, dim2=-1).masked_fill_(chunks.self_blocked, float("-inf"))
    fill_rows_(mask, ~chunks.has_key, 0.0)  # the rows without a key
    if bias is not None:
        query_positions = chunks.token_at.view(rows, -1, chunk)
        key_positions = torch.cat([chunks.previous_tokens, query_positions], dim=2)
        heads = chunks.shape[1]
        mask = mask + _head_bias(bias, query_positions.clamp(min=0), key_positions.clamp(min=0), heads).to(mask.dtype)
    return mask


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
    need_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k, v (B, H, n, D) (heads already expanded), clusters (B, H, n) -> out (B, H, n, D) and, with `need_lse`,
    the log-sum-exp of each query's scores (B, H, n; -inf where it has no key, and its output is zero). `no_self`:
    Reformer's rule (a token attends to itself only when nothing else is allowed).

    A chunk holds tokens of one cluster in position order, its real slots first; so the mask is the same
    structure in every chunk (the previous chunk whole, if it is the same cluster's; the own chunk under the
    causal triangle) less the empty and padded keys, and the number of keys a query sees is a count, not a
    search: one additive (chunks, C, 2C) mask, one batched matmul with it, the softmax by its log-sum-exp."""
    chunks = chunk_layout(
        q, k, v, clusters, num_clusters, chunk, causal=causal, key_padding_mask=key_padding_mask, no_self=no_self
    )
    if use_fast_kernels() and fast_clustered.applies_own_and_previous((q, k, v), dropout_p, no_self, bias, need_lse):
        padded = key_padding_mask is not None
        return fast_clustered.own_and_previous(q, k, v, chunks, causal=causal, padded=padded, need_lse=need_lse)
    return chunk_attention(chunks, chunk_mask(chunks, causal=causal, bias=bias), dropout_p=dropout_p, need_lse=need_lse)


def chunk_attention(
    chunks: Chunks, mask: torch.Tensor, *, dropout_p: float = 0.0, need_lse: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention of each chunk's queries over its keys under `mask` (`chunk_mask`), back in token order:
    out (B, H, n, D) and the log-sum-exp (B, H, n), as `clustered_attention` returns them."""
    queries, keys, values = chunks.queries, chunks.keys, chunks.values
    if use_fast_kernels() and fast_clustered.applies((queries, keys, values, mask), dropout_p):
        out, lse = fast_clustered.fused_chunks(queries, keys, values, mask.flatten(0, 1))
        return to_tokens(out, lse, chunks, need_lse)
    scale = 1.0 / math.sqrt(queries.shape[-1])
    scores = torch.baddbmm(mask.flatten(0, 1), queries, keys.transpose(1, 2), alpha=scale)  # (N * M, C, 2C)
    probs = torch.softmax(scores, dim=-1)  # one fused pass
    # The log-sum-exp from it without a second exp pass: at the row's largest score, p = exp(max - lse).
    lse = scores.amax(dim=-1) - probs.amax(dim=-1).log() if need_lse else None
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return to_tokens(torch.bmm(probs, values), lse, chunks, need_lse)


def to_tokens(out: torch.Tensor, lse: torch.Tensor | None, chunks: Chunks, need_lse: bool = True):
    """The chunks' outputs (N * M, C, D) and log-sum-exps (N * M, C) back in token order: (B, H, n, D), (B, H, n)
    (zero and -inf where a query has no key)."""
    batch, heads, length, dim = chunks.shape
    has_key, slots = chunks.has_key, chunks.slots
    rows = batch * heads
    total = has_key.shape[1] * has_key.shape[2]
    out = out.reshape(rows, -1, out.shape[1], dim).masked_fill(~has_key[..., None], 0.0).view(rows * total, dim)
    out = out.index_select(0, (slots + total * torch.arange(rows, device=out.device)[:, None]).flatten())
    out = out.view(batch, heads, length, dim)
    if not need_lse:
        return out, None
    lse = lse.reshape(has_key.shape).masked_fill(~has_key, float("-inf")).view(rows, total)
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
    across_clusters: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same attention through the dense (T, S) mask: q (B, H, T, D) the last T of S tokens (decoding), k, v
    (B, H, S, D), clusters (B, H, S) -> out (B, H, T, D), the probabilities (B, H, T, S) (need_weights) and the
    log-sum-exp (B, H, T). `start`: the position of the first key (for the bias); `across_clusters` as in
    `chunk_layout`. For small inputs."""
    batch, heads, q_len, dim = q.shape
    length = k.shape[2]
    clusters = clusters.flatten(0, 1)
    allowed = dense_cluster_mask(clusters, num_clusters, chunk, q_len, causal, across_clusters).view(
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


class ClusteredKernel(Kernel):
    """What routing and LSH share around the functions above: self-attention within content clusters (as many
    queries as keys), a position bias per chunk, state per key/value head (so grouped heads are not repeated heads),
    and decoding by a KVCache of every token so far, under whose pattern the new queries attend densely.

    A subclass says how it attends (`attend`: the forward past the check), what the cache keeps of the keys
    (`cached_keys`; LSH: the normalised queries) and how the new queries attend over everything cached
    (`attend_cached`)."""

    supports_position_bias = True
    groups_as_repeated_heads = False

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if q.shape[2] != k.shape[2]:
            raise ValueError(
                f"{self.name} attention is self-attention: as many queries as keys, got {q.shape[2]} and {k.shape[2]}"
            )
        return self.attend(q, k, v, call)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def new_cache(self) -> KVCache:
        return KVCache()

    def cached_keys(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """What the cache keeps as this call's keys (B, G, t, D)."""
        return k

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal: the new queries (B, H, t, D) attend under the pattern of all tokens so far (a token's chunk counts
        only earlier tokens, so the earlier tokens' pattern is unchanged); weights (B, H, t, offset + t)."""
        padding = new_tokens_padding(call.key_padding_mask, k.shape[2])
        keys, values = cache.append(self.cached_keys(q, k), v, padding)
        return self.attend_cached(q, keys, values, cache.key_padding_mask(), call)

    def attend_cached(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, padding: torch.Tensor | None,
        call: AttentionCall,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """The new queries (B, H, t, D) over every cached key and value (B, G, offset + t, D), `padding` theirs."""
        raise NotImplementedError
