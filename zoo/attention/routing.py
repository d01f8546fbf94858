"""Routing attention (Roy et al. 2021, "Efficient Content-Based Sparse Attention with Routing Transformers").

The paper's models mix two kinds of heads: the first `local_heads` query heads attend within a sliding window
(zoo/attention/local.py: the previous `window` keys, causal; `window // 2` on each side otherwise), the others
route. Tokens are routed to `clusters` centroids by online k-means, and each routing query attends to keys of
its cluster:

    assignment   c_t = argmax_c mu_c . k_t / |k_t|  (spherical k-means on the normalised keys; one cluster per
                 token, which its query and its key share, so that the kernel's keys are what a decoding cache
                 keeps and a query always finds itself in its cluster)
    start        centroid_init=keys: the first training batch sets mu to `clusters` of its real keys drawn at
                 random (torch's generator), normalised (the peer routing-transformer's Kmeans.init, without its
                 Lloyd iterations); a buffer flag records it, so checkpoints do not draw again. random: unit
                 Gaussian directions, kept until training moves them
    update       in training, mu_c <- decay mu_c + (1 - decay) mean of the normalised keys assigned to c (over
                 the batch and the real tokens; the paper's section 4.1 EMA), then mu_c / |mu_c|; a cluster
                 that got no key keeps its centroid. The centroids are a buffer (per layer and key/value head):
                 checkpoints carry them
    balance      each cluster's tokens are cut, in position order, into chunks of `chunk_size` (default
                 ceil(max_length / clusters), the paper's balanced cluster size n / k): a query attends to the
                 keys of its cluster in its chunk and the previous one (zoo/attention/clustered.py). The paper
                 balances by each centroid's top-k tokens over the whole sequence; here a chunk holds at most
                 chunk_size tokens however unbalanced the clusters, and, because a token's chunk counts only
                 earlier tokens, causal attention stays causal and decoding equals the forward

A query whose cluster holds no key it may see: with a shared assignment this happens only when its own key
is padding (it always sees itself otherwise); the row then outputs zeros, as the contract's rule for rows with
no key. Exact: softmax(q k^T / sqrt(d) + bias) v under each head's mask (the band, or the clusters' chunks),
O(n (window + chunk_size)) time and memory.

Why local heads: the assignment gets no gradient and a query shares its key's cluster, so training cannot bring
a value to the query that needs it; the local heads give every token its neighbourhood whatever the clusters
(measured in experiments/results/content_attention.md, issue 72).
"""

from __future__ import annotations

import math
import warnings

import torch

from zoo.attention.blockwise import DENSE_MAX_LENGTH
from zoo.attention.clustered import ClusteredKernel, clustered_attention, dense_clustered_attention
from zoo.attention.contract import AttentionCall, HeadLayout, ScoreBias, TokenLayout
from zoo.attention.functional import repeat_kv
from zoo.attention.global_tokens import check_count
from zoo.attention.sliding_window import sliding_window_attention
from zoo.errors import ZooWarning, check_choice, check_positive_int

CENTROID_INITS = ("keys", "random")


class HeadsOfBias:
    """A ScoreBias for query heads start ... stop - 1 of `bias` (the local heads' or the routing heads' share)."""

    def __init__(self, bias: ScoreBias, start: int, stop: int) -> None:
        self.bias, self.start, self.stop = bias, start, stop

    def __call__(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        return self.bias(query_positions, key_positions)[..., self.start : self.stop, :, :]


def heads_of(x: torch.Tensor, groups: int, start: int, stop: int) -> torch.Tensor:
    """Key/value heads (B, G, S, D) -> those serving query heads start ... stop - 1: still grouped where the range
    covers whole groups, else one per query head (B, stop - start, S, D)."""
    if start % groups == 0 and stop % groups == 0:
        return x[:, start // groups : stop // groups]
    return repeat_kv(x, groups)[:, start:stop]


def split_bias(bias: ScoreBias | None, start: int, stop: int) -> ScoreBias | None:
    """`bias` for query heads start ... stop - 1 (None stays None)."""
    return None if bias is None else HeadsOfBias(bias, start, stop)


class RoutingAttention(ClusteredKernel):
    """Routing attention (Roy et al. 2021) with local heads, k-means centroids as a buffer and a KVCache for
    decoding.

    Args:
        clusters: k, the centroids per key/value head; None: ceil(sqrt(max_length)).
        chunk_size: tokens per chunk of a cluster; None: ceil(max_length / clusters).
        decay: the centroids' exponential moving average, in (0, 1).
        local_heads: the first query heads, which attend within the sliding window instead of routing (the
            paper's mix; routing-transformer's n_local_attn_heads); None: half of the heads, rounded down.
        window: the local heads' keys per query (causal: the previous `window` including itself; bidirectional:
            window // 2 on each side); None: 2 * chunk_size, as many as a routing query sees at most.
        centroid_init: keys: the first training batch sets the centroids to randomly drawn keys' directions;
            random: random unit directions.
    """

    name = "routing"
    example_options = (
        {"clusters": 3, "chunk_size": 4, "local_heads": 0},
        {"clusters": 3, "chunk_size": 4, "local_heads": 1, "window": 5, "centroid_init": "random"},
    )

    def __init__(
        self,
        *,
        clusters: int | None = None,
        chunk_size: int | None = None,
        decay: float = 0.999,
        local_heads: int | None = None,
        window: int | None = None,
        centroid_init: str = "keys",
    ) -> None:
        super().__init__()
        check_positive_int("attention.clusters (variant 'routing')", clusters, allow_none=True)
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0.0 < decay < 1.0:
            raise ValueError(f"attention.decay (variant 'routing') must be a number in (0, 1), got {decay!r}")
        if local_heads is not None:
            check_count("attention.local_heads (variant 'routing')", local_heads)
        check_positive_int("attention.window (variant 'routing')", window, allow_none=True)
        check_choice("attention.centroid_init", centroid_init, CENTROID_INITS)
        self.clusters = clusters
        self.chunk_size = chunk_size
        self.decay = decay
        self.local_heads = local_heads
        self.window = window
        self.centroid_init = centroid_init
        self.register_buffer("centroids", None)  # (G, clusters, D), created in setup_heads
        # Set once the centroids hold data (centroid_init=keys: after the first training batch)
        self.register_buffer("centroids_initialised", torch.tensor(centroid_init == "random"))

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        if layout.max_length is None and (self.clusters is None or self.chunk_size is None):
            raise ValueError(
                "variant 'routing' sizes its clusters by the model's max length, which this attention was not told; "
                "give attention.clusters and attention.chunk_size, positive ints"
            )
        self.num_clusters = self.clusters or math.isqrt(layout.max_length - 1) + 1
        self.chunk = self.chunk_size or -(-layout.max_length // self.num_clusters)
        self.local_window = self.window or 2 * self.chunk

    def setup_heads(self, heads: HeadLayout) -> None:
        super().setup_heads(heads)
        if not hasattr(self, "num_clusters"):
            self.setup(getattr(self, "layout", TokenLayout()))
        self.num_local_heads = heads.num_heads // 2 if self.local_heads is None else self.local_heads
        if self.num_local_heads > heads.num_heads:
            raise ValueError(
                f"attention.local_heads={self.local_heads} (variant 'routing') must be at most the "
                f"{heads.num_heads} query heads"
            )
        centroids = torch.randn(heads.kv_heads, self.num_clusters, heads.head_dim)
        self.register_buffer("centroids", centroids / centroids.norm(dim=-1, keepdim=True))

    def extra_repr(self) -> str:
        return (
            f"clusters={getattr(self, 'num_clusters', self.clusters)}, chunk_size={getattr(self, 'chunk', None)}, "
            f"local_heads={getattr(self, 'num_local_heads', self.local_heads)}, "
            f"window={getattr(self, 'local_window', self.window)}, centroid_init={self.centroid_init}"
        )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args) -> None:
        """A checkpoint from before local heads and centroid_init has no `centroids_initialised`: its centroids are
        what it trained with (or drew), so they are kept, and all its heads routed."""
        key = prefix + "centroids_initialised"
        if prefix + "centroids" in state_dict and key not in state_dict:
            state_dict[key] = torch.tensor(True)
            if getattr(self, "num_local_heads", 0):
                warnings.warn(
                    f"this routing attention checkpoint ({prefix or 'kernel'}) predates local heads: all its heads "
                    f"routed; attention.local_heads={self.num_local_heads} makes the first ones local. Give "
                    "attention.local_heads=0 to compute as it was trained",
                    ZooWarning,
                    stacklevel=2,
                )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)

    def assign(self, k: torch.Tensor) -> torch.Tensor:
        """Keys (B, G, n, D) -> each token's nearest centroid (B, G, n) by cosine."""
        if self.centroids is None:
            raise ValueError("variant 'routing' creates its centroids in setup_heads(HeadLayout(...)); call it first")
        return torch.einsum("bgnd,gcd->bgnc", k, self.centroids.to(k.dtype)).argmax(dim=-1)

    @torch.no_grad()
    def initialise_centroids(self, k: torch.Tensor, key_padding_mask: torch.Tensor | None) -> None:
        """The centroids of every key/value head from the keys (B, G, n, D) of `clusters` real tokens drawn at
        random without replacement (with it, where the batch has fewer real tokens), normalised."""
        batch, kv_heads, length, dim = k.shape
        real = torch.ones(batch * length, dtype=torch.bool, device=k.device)
        if key_padding_mask is not None:
            real = ~key_padding_mask.bool().flatten()
        tokens = real.nonzero()[:, 0]
        if len(tokens) >= self.num_clusters:
            drawn = tokens[torch.randperm(len(tokens), device=k.device)[: self.num_clusters]]
        else:
            drawn = tokens[torch.randint(len(tokens), (self.num_clusters,), device=k.device)]
        keys = k.transpose(1, 2).reshape(batch * length, kv_heads, dim)[drawn].transpose(0, 1).float()  # (G, C, D)
        self.centroids.copy_(keys / keys.norm(dim=-1, keepdim=True).clamp(min=1e-12))
        self.centroids_initialised.fill_(True)

    @torch.no_grad()
    def update_centroids(self, k: torch.Tensor, clusters: torch.Tensor, key_padding_mask: torch.Tensor | None) -> None:
        """One step of online spherical k-means: each centroid moves towards the mean of its normalised keys."""
        unit = (k / k.norm(dim=-1, keepdim=True).clamp(min=1e-12)).float()  # (B, G, n, D)
        weight = torch.ones(clusters.shape, dtype=unit.dtype, device=unit.device)
        if key_padding_mask is not None:
            weight = weight.masked_fill(key_padding_mask.bool()[:, None, :], 0.0)
        # each key added to its (head, cluster) row: O(n D), where a one-hot product would cost O(n C D)
        groups, count, dim = self.centroids.shape
        index = (clusters + count * torch.arange(groups, device=clusters.device)[:, None]).flatten()
        sums = unit.new_zeros(groups * count, dim).index_add_(0, index, (unit * weight[..., None]).reshape(-1, dim))
        counts = unit.new_zeros(groups * count).index_add_(0, index, weight.flatten())
        sums, counts = sums.view(groups, count, dim), counts.view(groups, count, 1)
        means = sums / counts.clamp(min=1.0)
        moved = self.decay * self.centroids.float() + (1.0 - self.decay) * means
        moved = moved / moved.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        self.centroids.copy_(torch.where(counts > 0, moved, self.centroids.float()).to(self.centroids.dtype))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        causal, key_padding_mask, bias, dropout_p = call.causal, call.key_padding_mask, call.bias, call.dropout_p
        need_weights = call.need_weights
        heads, groups, local = q.shape[1], q.shape[1] // k.shape[1], self.num_local_heads
        options = dict(causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p)
        parts = []
        if local:
            local_part = sliding_window_attention(
                q[:, :local], heads_of(k, groups, 0, local), heads_of(v, groups, 0, local), self.local_window,
                **options, need_weights=need_weights, bias=split_bias(bias, 0, local),
                dense=k.shape[2] <= DENSE_MAX_LENGTH,
            )  # fmt: skip
            parts.append(local_part)
        if local < heads:
            drawn = self.training and not bool(self.centroids_initialised)
            if drawn:
                self.initialise_centroids(k, key_padding_mask)  # this batch's step: the draw, no average
            clusters = self.assign(k)  # (B, G, n)
            if self.training and not drawn:
                self.update_centroids(k, clusters, key_padding_mask)
            parts.append(self._route(q, k, v, clusters, need_weights, bias, **options))
        outs, weights = zip(*parts)
        return torch.cat(outs, dim=1), (torch.cat(weights, dim=1) if need_weights else None)

    def _route(self, q, k, v, clusters, need_weights, bias, **options):
        """The routing heads' attention: q (B, H, n, D) of which heads local_heads ... H - 1 route, k, v (B, G, n,
        D), clusters (B, G, n)."""
        heads, first = q.shape[1], self.num_local_heads
        groups = heads // k.shape[1]
        q, k, v = q[:, first:], repeat_kv(k, groups)[:, first:], repeat_kv(v, groups)[:, first:]
        clusters = repeat_kv(clusters[..., None], groups)[:, first:, :, 0]
        options = dict(options, bias=split_bias(bias, first, heads) if first else bias)
        if need_weights:
            out, weights, _ = dense_clustered_attention(q, k, v, clusters, self.num_clusters, self.chunk, **options)
            return out, weights
        out, _ = clustered_attention(q, k, v, clusters, self.num_clusters, self.chunk, **options, need_lse=False)
        return out, None

    def attend_cached(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, padding: torch.Tensor | None,
        call: AttentionCall,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """The local heads: the last `window` keys; the routing heads: their clusters' chunks."""
        need_weights, bias = call.need_weights, call.bias
        heads, groups, local = q.shape[1], q.shape[1] // keys.shape[1], self.num_local_heads
        outs, weights = [], []
        if local:
            out, local_weights = sliding_window_attention(
                q[:, :local], heads_of(keys, groups, 0, local), heads_of(values, groups, 0, local), self.local_window,
                causal=True, key_padding_mask=padding, need_weights=need_weights, bias=split_bias(bias, 0, local),
                dense=True,
            )  # fmt: skip
            outs.append(out)
            weights.append(local_weights)
        if local < heads:
            clusters = repeat_kv(self.assign(keys)[..., None], groups)[:, local:, :, 0]
            out, routing_weights, _ = dense_clustered_attention(
                q[:, local:], repeat_kv(keys, groups)[:, local:], repeat_kv(values, groups)[:, local:], clusters,
                self.num_clusters, self.chunk, causal=True, key_padding_mask=padding,
                bias=split_bias(bias, local, heads) if local else bias,
            )  # fmt: skip
            outs.append(out)
            weights.append(routing_weights)
        return torch.cat(outs, dim=1), (torch.cat(weights, dim=1) if need_weights else None)
