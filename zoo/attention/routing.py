"""Routing attention (Roy et al. 2021, "Efficient Content-Based Sparse Attention with Routing Transformers").

Tokens are routed to `clusters` centroids by online k-means, and each query attends to keys of its cluster:

    assignment   c_t = argmax_c mu_c . k_t / |k_t|  (spherical k-means on the normalised keys; one cluster per
                 token, which its query and its key share, so that the kernel's keys are what a decoding cache
                 keeps and a query always finds itself in its cluster)
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
no key. Exact: softmax(q k^T / sqrt(d) + bias) v under that mask, O(n chunk_size) time and memory.
"""

from __future__ import annotations

import math

import torch

from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.clustered import clustered_attention, dense_clustered_attention
from zoo.attention.contract import AttentionCall, HeadLayout, Kernel, TokenLayout
from zoo.attention.functional import repeat_kv
from zoo.errors import check_positive_int


class RoutingAttention(Kernel):
    """Routing attention (Roy et al. 2021) with k-means centroids as a buffer and a KVCache for decoding.

    Args:
        clusters: k, the centroids per key/value head; None: ceil(sqrt(max_length)).
        chunk_size: tokens per chunk of a cluster; None: ceil(max_length / clusters).
        decay: the centroids' exponential moving average, in (0, 1).
    """

    name = "routing"
    supports_position_bias = True
    groups_as_repeated_heads = False  # centroids per key/value head
    example_options = ({"clusters": 3, "chunk_size": 4},)

    def __init__(self, *, clusters: int | None = None, chunk_size: int | None = None, decay: float = 0.999) -> None:
        super().__init__()
        check_positive_int("attention.clusters (variant 'routing')", clusters, allow_none=True)
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0.0 < decay < 1.0:
            raise ValueError(f"attention.decay (variant 'routing') must be a number in (0, 1), got {decay!r}")
        self.clusters = clusters
        self.chunk_size = chunk_size
        self.decay = decay
        self.register_buffer("centroids", None)  # (G, clusters, D), created in setup_heads

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        if layout.max_length is None and (self.clusters is None or self.chunk_size is None):
            raise ValueError(
                "variant 'routing' sizes its clusters by the model's max length, which this attention was not told; "
                "give attention.clusters and attention.chunk_size, positive ints"
            )
        self.num_clusters = self.clusters or math.isqrt(layout.max_length - 1) + 1
        self.chunk = self.chunk_size or -(-layout.max_length // self.num_clusters)

    def setup_heads(self, heads: HeadLayout) -> None:
        super().setup_heads(heads)
        if not hasattr(self, "num_clusters"):
            self.setup(getattr(self, "layout", TokenLayout()))
        centroids = torch.randn(heads.kv_heads, self.num_clusters, heads.head_dim)
        self.register_buffer("centroids", centroids / centroids.norm(dim=-1, keepdim=True))

    def extra_repr(self) -> str:
        return f"clusters={getattr(self, 'num_clusters', self.clusters)}, chunk_size={getattr(self, 'chunk', None)}"

    def assign(self, k: torch.Tensor) -> torch.Tensor:
        """Keys (B, G, n, D) -> each token's nearest centroid (B, G, n) by cosine."""
        if self.centroids is None:
            raise ValueError("variant 'routing' creates its centroids in setup_heads(HeadLayout(...)); call it first")
        return torch.einsum("bgnd,gcd->bgnc", k, self.centroids.to(k.dtype)).argmax(dim=-1)

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

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        causal, key_padding_mask, bias, dropout_p = call.causal, call.key_padding_mask, call.bias, call.dropout_p
        need_weights = call.need_weights
        if q.shape[2] != k.shape[2]:
            raise ValueError(
                f"routing attention is self-attention: as many queries as keys, got {q.shape[2]} and {k.shape[2]}"
            )
        clusters = self.assign(k)  # (B, G, n)
        if self.training:
            self.update_centroids(k, clusters, key_padding_mask)
        groups = q.shape[1] // k.shape[1]
        k, v, clusters = repeat_kv(k, groups), repeat_kv(v, groups), repeat_kv(clusters[..., None], groups)[..., 0]
        options = dict(causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p, bias=bias)
        if need_weights:
            out, weights, _ = dense_clustered_attention(q, k, v, clusters, self.num_clusters, self.chunk, **options)
            return out, weights
        out, _ = clustered_attention(q, k, v, clusters, self.num_clusters, self.chunk, **options, need_lse=False)
        return out, None

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal: the new queries (B, H, t, D) attend under the pattern of all tokens so far (their clusters'
        chunks count only earlier tokens, so the earlier tokens' pattern is unchanged); weights (B, H, t, offset+t)."""
        key_padding_mask, need_weights, bias = call.key_padding_mask, call.need_weights, call.bias
        keys, values = cache.append(k, v, new_tokens_padding(key_padding_mask, k.shape[2]))
        groups = q.shape[1] // k.shape[1]
        clusters = repeat_kv(self.assign(keys)[..., None], groups)[..., 0]
        out, weights, _ = dense_clustered_attention(
            q, repeat_kv(keys, groups), repeat_kv(values, groups), clusters, self.num_clusters, self.chunk,
            causal=True, key_padding_mask=cache.key_padding_mask(), bias=bias,
        )  # fmt: skip
        return out, weights if need_weights else None
