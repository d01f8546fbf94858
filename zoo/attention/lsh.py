"""LSH attention (Kitaev et al. 2020, "Reformer: The Efficient Transformer", section 2).

    shared QK    the keys are the normalised queries, k_j = q_j / |q_j| (the kernel ignores the k it is given)
    hashing      angular LSH by a random rotation R (D, buckets / 2) per round and head:
                 h(x) = argmax([x R ; -x R]) over `buckets` buckets (Andoni et al. 2015)
    chunks       per round, each bucket's tokens in position order cut into chunks of `chunk_size`; a query
                 attends to its chunk and the previous one (zoo/attention/clustered.py: per bucket, so causal
                 attention stays causal and decoding equals the forward). `chunk_keys` says which keys of them:
                 chunk   every key of the pair; a bucket's first chunk has as previous chunk the first chunk of
                         bucket b - 1 (mod buckets): Reformer's sort of the whole sequence lets a chunk see
                         its neighbour's other buckets, but would give it the previous bucket's last chunk,
                         which later tokens change
                 bucket  only the keys of the query's bucket (a bucket's first chunk has no previous one)
    self         a token attends to itself only when no other key is allowed (its own key would dominate)
    rounds       `hashes` rounds, each a softmax over its keys with log-sum-exp lse_r; combined as
                 out_i = sum_r exp(lse_r,i - logsumexp_r lse_r,i) out_r,i (the paper's eq. for multi-round LSH
                 attention; a key found in several rounds counts in each of them, as in the paper's code)

The rotations are drawn afresh each training forward (from torch's global generator) and fixed by `seed` in
evaluation and decoding. Checkpoints: the parameter layout is MultiHeadAttention's, so any variant's checkpoint
loads into lsh and back; its key projection is loaded but unused here (shared QK), so a model trained with
another variant attends differently under lsh.
"""

from __future__ import annotations

import torch

from zoo.attention.cache import KVCache
from zoo.attention.clustered import (
    ClusteredKernel,
    chunk_attention,
    chunk_layout,
    chunk_mask,
    dense_clustered_attention,
    to_tokens,
)
from zoo.attention.contract import AttentionCall, TokenLayout
from zoo.attention.fast import clustered as fast_clustered
from zoo.attention.fast import use_fast_kernels
from zoo.attention.functional import repeat_kv
from zoo.errors import check_choice, check_positive_int

CHUNK_KEYS = ("chunk", "bucket")  # the keys a query takes from its chunk pair: all of them, or its bucket's


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: x (B, H, n, D), rotations (R, H, D, b / 2) -> buckets (R, B, H, n) = argmax([xR; -xR])."""
    rotated = torch.einsum("bhnd,rhdk->rbhnk", x, rotations.to(x.dtype))
    # argmax over [xR; -xR] without building it: the largest of xR, or the most negative (ties: the first half).
    largest, smallest = rotated.max(dim=-1), rotated.min(dim=-1)
    return torch.where(largest.values >= -smallest.values, largest.indices, rotated.shape[-1] + smallest.indices)


def combine_rounds(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """(R, B, H, n, D), (R, B, H, n) -> (B, H, n, D): the rounds weighted by their share of the total mass."""
    finite = torch.isfinite(lses)
    safe = lses.masked_fill(~finite, -1e30)  # a round without keys weighs nothing; no NaN if none has keys
    weights = torch.softmax(safe, dim=0).masked_fill(~finite, 0.0)
    return (weights[..., None].to(outs.dtype) * outs).sum(dim=0)


class LSHAttention(ClusteredKernel):
    """Reformer's LSH attention (Kitaev et al. 2020) with a KVCache (of normalised queries) for decoding.

    Args:
        hashes: rounds of hashing.
        buckets: buckets per round, even; None: about max_length / chunk_size.
        chunk_size: tokens per chunk of a bucket.
        chunk_keys: which keys of the query's chunk and the previous one: chunk (all) | bucket (its bucket's only).
        seed: the seed of the rotations in evaluation (training draws fresh ones).
    """

    name = "lsh"
    example_options = (
        {"hashes": 2, "buckets": 4, "chunk_size": 4},
        {"hashes": 2, "buckets": 4, "chunk_size": 4, "chunk_keys": "bucket"},
    )

    def __init__(
        self,
        *,
        hashes: int = 4,
        buckets: int | None = None,
        chunk_size: int = 64,
        chunk_keys: str = "chunk",
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_choice("attention.chunk_keys (variant 'lsh')", chunk_keys, CHUNK_KEYS)
        check_positive_int("attention.hashes (variant 'lsh')", hashes)
        check_positive_int("attention.buckets (variant 'lsh')", buckets, allow_none=True)
        check_positive_int("attention.chunk_size", chunk_size)
        if buckets is not None and buckets % 2:
            raise ValueError(
                f"attention.buckets (variant 'lsh') must be even (a rotation and its negation), got {buckets}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"attention.seed (variant 'lsh') must be an int, got {seed!r}")
        self.hashes, self.buckets, self.chunk_size, self.seed = hashes, buckets, chunk_size, seed
        self.chunk_keys = chunk_keys

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        if self.buckets is None and layout.max_length is None:
            raise ValueError(
                "attention.buckets (variant 'lsh') is null, which means about max_length / chunk_size, but this "
                "attention was not told the model's max length; give attention.buckets, a positive even int"
            )
        self.num_buckets = self.buckets or max(2, 2 * -(-layout.max_length // (2 * self.chunk_size)))

    def extra_repr(self) -> str:
        buckets = getattr(self, "num_buckets", self.buckets)
        return (
            f"hashes={self.hashes}, buckets={buckets}, chunk_size={self.chunk_size}, chunk_keys={self.chunk_keys}, "
            f"seed={self.seed}"
        )

    def rotations(self, heads: int, dim: int, device: torch.device) -> torch.Tensor:
        """(hashes, H, D, buckets / 2): fresh in training, fixed by the seed otherwise."""
        if not hasattr(self, "num_buckets"):
            self.setup(getattr(self, "layout", TokenLayout()))
        shape = (self.hashes, heads, dim, self.num_buckets // 2)
        generator = None if self.training else torch.Generator().manual_seed(self.seed)
        return torch.randn(shape, generator=generator).to(device)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        causal, key_padding_mask, bias, dropout_p = call.causal, call.key_padding_mask, call.bias, call.dropout_p
        need_weights = call.need_weights
        keys = self.cached_keys(q, k)  # shared QK: the keys are the normalised queries
        values = repeat_kv(v, q.shape[1] // v.shape[1])
        buckets = lsh_buckets(q, self.rotations(q.shape[1], q.shape[3], q.device))
        across = self.chunk_keys == "chunk"
        options = dict(causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p, bias=bias, no_self=True)
        options["across_clusters"] = across
        if need_weights:
            rounds = [
                dense_clustered_attention(q, keys, values, b, self.num_buckets, self.chunk_size, **options)
                for b in buckets
            ]
            lses = torch.stack([lse for _, _, lse in rounds])
            weights = combine_rounds(torch.stack([p for _, p, _ in rounds]), lses)
            return combine_rounds(torch.stack([o for o, _, _ in rounds]), lses), weights
        layout = dict(causal=causal, key_padding_mask=key_padding_mask, no_self=True, across_clusters=across)
        chunks = [chunk_layout(q, keys, values, b, self.num_buckets, self.chunk_size, **layout) for b in buckets]
        masks = [chunk_mask(c, causal=causal, bias=bias) for c in chunks]
        if use_fast_kernels() and fast_clustered.applies_rounds(q, masks, dropout_p):
            return fast_clustered.joint_rounds(chunks, masks, to_tokens), None
        rounds = [chunk_attention(c, mask, dropout_p=dropout_p) for c, mask in zip(chunks, masks)]
        return combine_rounds(torch.stack([o for o, _ in rounds]), torch.stack([lse for _, lse in rounds])), None

    def cached_keys(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Shared QK: the keys are the queries, normalised (every query head keeps its own)."""
        return q / q.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal, in evaluation's fixed hashes: the cache keeps the normalised queries (the keys) of every head."""
        if self.training:
            raise ValueError("variant 'lsh' decodes in eval mode only: training draws fresh hashes every call")
        return super().decode(q, k, v, cache, call)

    def attend_cached(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, padding: torch.Tensor | None,
        call: AttentionCall,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        values = repeat_kv(values, q.shape[1] // values.shape[1])
        buckets = lsh_buckets(keys, self.rotations(q.shape[1], q.shape[3], q.device))
        options = dict(causal=True, key_padding_mask=padding, bias=call.bias, no_self=True)
        options["across_clusters"] = self.chunk_keys == "chunk"
        rounds = [
            dense_clustered_attention(q, keys, values, b, self.num_buckets, self.chunk_size, **options) for b in buckets
        ]
        lses = torch.stack([lse for _, _, lse in rounds])
        out = combine_rounds(torch.stack([o for o, _, _ in rounds]), lses)
        return out, combine_rounds(torch.stack([p for _, p, _ in rounds]), lses) if call.need_weights else None
