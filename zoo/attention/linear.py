"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

With a non-negative feature map phi in place of exp(q . k / sqrt(d)) (zoo/attention/feature_maps.py: elu + 1,
ReLU, or Performer's FAVOR+ random features), attention factorises (eq. 4-6):
out_i = phi(q_i)^T S / phi(q_i)^T z,  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j).
Bidirectional: one pass in O(n F d) (F features per head). Causal: the sums run over j <= i; computed in
chunks, with a quadratic causal product inside each chunk and the state of all earlier chunks from one
prefix sum over per-chunk states (no loop over tokens). Decoding keeps only [S | z] (eq. 18-20),
per key/value head (grouped-query attention shares one state among the query heads of a group).

The denominator phi(q_i)^T z comes from the same chunks as the numerator (row sums of the intra-chunk
scores, phi(q) . z of earlier chunks): no column of ones is appended to v, which would cost a copy of v
and a width of D + 1 that matmuls handle worse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from zoo.attention.cache import LinearAttentionState, new_tokens_padding
from zoo.attention.contract import AttentionCall, HeadLayout, Kernel
from zoo.attention.fast import linear as fast_linear
from zoo.attention.fast import use_fast_kernels
from zoo.attention.feature_maps import (
    FEATURE_MAPS,
    default_num_features,
    elu_feature_map,
    favor_feature_map,
    orthogonal_random_features,
    relu_feature_map,
)
from zoo.attention.functional import repeat_kv
from zoo.errors import check_choice, check_positive_int

# Tokens per chunk of the causal kernel, chosen by measurement (experiments/results/recipes.md): smaller
# chunks mean more per-chunk states, larger ones a bigger quadratic part.
DEFAULT_CHUNK_SIZE = 64

# phi(x, is_query, workspace): queries and keys may be mapped differently (FAVOR+ stabilises queries only);
# `workspace` (or None): the fast path's scratch tensors to write into (fast/linear.py's `scratch`).
FeatureMap = Callable[[torch.Tensor, bool, "dict | None"], torch.Tensor]


def _safe_normaliser(denominator: torch.Tensor) -> torch.Tensor:
    """phi(q) . z as it is, replaced by 1 only where it underflows (below the dtype's smallest normal number): with
    every feature non-negative the numerator is then as small, so such a row comes out (near) zero, and its gradient
    stays finite (a clamp to the smallest normal would give 1 / tiny, which overflows in the backward of an
    integrated-gradients path from a zero embedding). The paper's code adds eps = 1e-6 instead, which moved every
    row of small total mass (first causal rows, far keys under FAVOR+) far off the formula
    (tests/attention/test_favor_unbiased.py)."""
    return torch.where(denominator >= torch.finfo(denominator.dtype).tiny, denominator, 1.0)


def _fresh(workspace: None, name: str, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """No scratch tensor (the reference path): each result is a fresh tensor."""
    return None


def _elu(x: torch.Tensor, is_query: bool, workspace: dict | None = None) -> torch.Tensor:
    if workspace is None:
        return elu_feature_map(x)
    role = "phi_q" if is_query else "phi_k"
    scratch = fast_linear.scratch
    return elu_feature_map(x, scratch(workspace, role, x.shape, x), scratch(workspace, "negative", x.shape, x))


def _features(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
    feature_map: FeatureMap = _elu,
    workspace: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """phi(q), phi(k) with padded keys zeroed (they contribute nothing), and v (dropped out).

    Attention dropout: a kept key's value is scaled by 1 / (1 - p), a dropped one zeroed, in the
    numerator only. This is dropout on the implicit normalised weights with one mask per key and head
    shared by all queries (per-entry masks would need the n x n matrix); like softmax attention
    dropout it leaves the expected output unchanged.
    """
    phi_q, phi_k = feature_map(q, True, workspace), feature_map(k, False, workspace)
    if key_padding_mask is not None:
        phi_k = phi_k.masked_fill(key_padding_mask.bool()[:, None, :, None], 0.0)
    if dropout_p > 0.0:
        keep = torch.empty(v.shape[:-1] + (1,), dtype=v.dtype, device=v.device).bernoulli_(1.0 - dropout_p)
        v = v * keep / (1.0 - dropout_p)
    return phi_q, phi_k, v


def quadratic_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    feature_map: FeatureMap = _elu,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same attention through the explicit (T, S) matrix phi(q) phi(k)^T (eq. 4): the reference,
    and the normalised weights (B, H, T, S) for need_weights. Causal queries sit at the last positions."""
    phi_q, phi_k, values = _features(q, k, v, key_padding_mask, dropout_p, feature_map)
    groups = q.shape[1] // k.shape[1]
    phi_k, values = repeat_kv(phi_k, groups), repeat_kv(values, groups)
    scores = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    if causal:
        q_len, k_len = q.shape[2], k.shape[2]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, 0.0)
    weights = scores / _safe_normaliser(scores.sum(dim=-1, keepdim=True))
    return weights @ values, weights


def _bidirectional(phi_q: torch.Tensor, phi_k: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """O(n F d): S = phi(K)^T V and z = sum_j phi(k_j) once per key/value head, then phi(Q) S / phi(Q) z for
    its query heads."""
    batch, heads, length, features = phi_q.shape
    kv_heads = phi_k.shape[1]
    state = phi_k.transpose(-2, -1) @ values  # (B, G, F, D)
    z = phi_k.sum(dim=2)[..., None]  # (B, G, F, 1)
    grouped = phi_q.reshape(batch, kv_heads, (heads // kv_heads) * length, features)  # query heads of a group
    out = (grouped @ state) / _safe_normaliser(grouped @ z)
    return out.view(batch, heads, length, -1)


def exclusive_prefix_sum(
    x: torch.Tensor, initial: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, nc, F), optional (N, F): `initial` plus the sum of the chunks before each chunk: a cumsum shifted by a
    row. `out` (x's shape, no autograd): where the fast path may write it."""
    if use_fast_kernels() and fast_linear.scan_applies(x):
        return fast_linear.exclusive_prefix_sum(x, initial, out)
    shifted = F.pad(x.cumsum(dim=1)[:, :-1], (0, 0, 1, 0))
    return shifted if initial is None else shifted + initial[:, None]


def causal_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    values: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    state: torch.Tensor | None = None,
    *,
    normalise: bool = False,
    out: torch.Tensor | None = None,
    workspace: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked causal linear attention on features: (B, H, T, D), (B, G, T, D), (B, G, T, E), G dividing H.

    Without `normalise`: `state` (B, G, D, E) sums the tokens before this call; returns the unnormalised
    numerator (B, H, T, E) and the state (B, G, D, E) after the last token. With `normalise`: the state is
    [S | z] (B, G, D, E + 1) and the output numerator / phi(q) . z, the denominator taken from the
    same chunks (row sums of the intra-chunk scores, phi(q) . z of the earlier chunks) instead of from a
    column of ones appended to the values (one copy of the values fewer, and E stays matmul-aligned).
    `out` (normalise, no autograd, whole chunks only): a (B, H, T, E) view the output is written into, e.g. a
    segment of a longer output (no joining copy afterwards). `workspace` (no autograd): a dict of scratch tensors
    (fast/linear.py's `scratch`) that the fast path's segments of one sequence share.
    """
    batch, heads, length, dim = phi_q.shape
    kv_heads, width = phi_k.shape[1], values.shape[-1]
    groups = heads // kv_heads
    chunk = max(1, min(chunk_size, length))
    n_chunks = -(-length // chunk)
    padded = n_chunks * chunk
    if padded != length:  # zero features: padding contributes nothing, its outputs are dropped
        pad = (0, 0, 0, padded - length)
        phi_q, phi_k, values = F.pad(phi_q, pad), F.pad(phi_k, pad), F.pad(values, pad)
    # (B * G * nc, C, .): the chunks as one batch of small matrices.
    k_chunks = phi_k.reshape(-1, chunk, dim)
    v_chunks = values.reshape(-1, chunk, width)
    sum_dtype = torch.promote_types(phi_q.dtype, torch.float32)  # long sums in fp32 also for bf16
    # Across chunks: each chunk's phi(K)^T V (per key/value head), summed over all earlier chunks.
    if workspace is not None and torch.is_grad_enabled():
        raise ValueError("causal_linear_attention reuses a workspace only without autograd")
    scratch = _fresh if workspace is None else fast_linear.scratch  # the fast path's reused tensors
    states_out = scratch(workspace, "states", (k_chunks.shape[0], dim, width), phi_k)
    chunk_states = torch.bmm(k_chunks.transpose(1, 2), v_chunks, out=states_out)
    chunk_states = chunk_states.view(batch * kv_heads, n_chunks, dim * width)
    chunk_states = chunk_states.to(sum_dtype)
    prior = None if state is None else (state[..., :width] if normalise else state)
    prior = None if prior is None else prior.reshape(batch * kv_heads, dim * width).to(sum_dtype)
    exclusive_out = scratch(workspace, "exclusive", chunk_states.shape, chunk_states)
    # The state before each chunk, earlier calls included.
    exclusive = exclusive_prefix_sum(chunk_states, prior, exclusive_out)
    final = (exclusive[:, -1] + chunk_states[:, -1]).view(batch, kv_heads, dim, width)
    exclusive = exclusive.view(batch, kv_heads, n_chunks, dim, width).to(phi_q.dtype)
    if normalise:  # the same sums for z = sum_j phi(k_j): (B, G, nc, D), a vector per chunk
        chunk_z = phi_k.reshape(batch * kv_heads, n_chunks, chunk, dim).sum(dim=2, dtype=sum_dtype)
        prior_z = None if state is None else state[..., width].reshape(batch * kv_heads, dim).to(sum_dtype)
        exclusive_z = exclusive_prefix_sum(chunk_z, prior_z)
        final_z = (exclusive_z[:, -1] + chunk_z[:, -1]).view(batch, kv_heads, dim)
        final = torch.cat([final, final_z[..., None]], dim=-1)
        exclusive_z = exclusive_z.view(batch, kv_heads, n_chunks, dim).to(phi_q.dtype)
    if groups > 1:  # every query head of a group reads its key/value head's states and chunks
        exclusive = exclusive[:, :, None].expand(batch, kv_heads, groups, n_chunks, dim, width)
        k_chunks = repeat_kv(phi_k, groups).reshape(-1, chunk, dim)
        v_chunks = repeat_kv(values, groups).reshape(-1, chunk, width)
        if normalise:
            exclusive_z = exclusive_z[:, :, None].expand(batch, kv_heads, groups, n_chunks, dim)
    exclusive = exclusive.reshape(-1, dim, width)
    q_chunks = phi_q.reshape(-1, chunk, dim)  # (B * H * nc, C, D)
    # Inside a chunk: the quadratic form with a causal mask, (C, C) per chunk.
    rows = q_chunks.shape[0]
    scores = torch.bmm(
        q_chunks, k_chunks.transpose(1, 2), out=scratch(workspace, "scores", (rows, chunk, chunk), phi_q)
    )
    scores = scores.tril_()
    numerator = torch.bmm(scores, v_chunks, out=scratch(workspace, "numerator", (rows, chunk, width), values))
    numerator = numerator.baddbmm_(q_chunks, exclusive)  # intra + inter, (B * H * nc, C, E)
    if not normalise:
        return numerator.reshape(batch, heads, padded, width)[:, :, :length], final
    # (B * H * nc, C, 1): intra-chunk row sums plus phi(q) . z of the earlier chunks (a product and a sum:
    # faster than baddbmm's many small matrix-vector products).
    product = scratch(workspace, "product", q_chunks.shape, q_chunks)
    denominator = torch.mul(q_chunks, exclusive_z.reshape(-1, 1, dim), out=product).sum(dim=-1, keepdim=True)
    denominator = _safe_normaliser(denominator.add_(scores.sum(dim=-1, keepdim=True)))
    if out is not None:
        if torch.is_grad_enabled() or padded != length:
            raise ValueError("causal_linear_attention writes into `out` only without autograd and for whole chunks")
        shape = (batch, heads, n_chunks, chunk, width)
        torch.div(numerator.view(shape), denominator.view(shape[:-1] + (1,)), out=out.view(shape))
        return out, final
    # In place where no graph needs the numerator (inference): one (n, E) allocation fewer.
    result = numerator.div_(denominator) if not torch.is_grad_enabled() else numerator / denominator
    return result.reshape(batch, heads, padded, width)[:, :, :length], final


class LinearAttention(Kernel):
    """Linear attention with a recurrent state of O(1) memory for decoding.

    FAVOR+'s random features are a buffer: fixed in eval and in decoding, and saved in checkpoints.
    need_weights returns the explicit normalised weights phi(q_i) . phi(k_j) / sum_j(...) from the
    quadratic formula, materialising (T, S): for inspecting small inputs only.

    Args:
        chunk_size: the chunk length of the causal kernel; None: the measured default, 64.
        feature_map: elu | relu | favor (zoo/attention/feature_maps.py).
        num_features: favor only: random features per head; None: Performer's head_dim * ln(head_dim).
        redraw_interval: favor only: training forward passes between fresh draws of the features (Performer's
            feature_redraw_interval); None: never.
    """

    name = "linear"
    supports_cross_attention = True
    supports_packing = True  # the causal prefix sums restart at every document: a state reset
    example_options = ({"chunk_size": 4}, {"feature_map": "relu"}, {"feature_map": "favor", "num_features": 16})

    def __init__(
        self,
        *,
        chunk_size: int | None = None,
        feature_map: str = "elu",
        num_features: int | None = None,
        redraw_interval: int | None = 1000,
    ) -> None:
        super().__init__()
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        check_choice("attention.feature_map", feature_map, FEATURE_MAPS)
        check_positive_int("attention.num_features", num_features, allow_none=True)
        check_positive_int("attention.redraw_interval", redraw_interval, allow_none=True)
        self.chunk_size = chunk_size
        self.feature_map = feature_map
        self.num_features = num_features
        self.redraw_interval = redraw_interval
        # FAVOR+'s features (num_features, head_dim) and the redraw counter, created in setup_heads.
        self.register_buffer("projection", None)
        self.register_buffer("forwards_since_redraw", None)

    def setup_heads(self, heads: HeadLayout) -> None:
        super().setup_heads(heads)
        if self.feature_map == "favor":
            rows = self.num_features or default_num_features(heads.head_dim)
            self.register_buffer("projection", orthogonal_random_features(rows, heads.head_dim))
            self.register_buffer("forwards_since_redraw", torch.zeros((), dtype=torch.long))

    def redraw_features(self) -> None:
        """A fresh draw of FAVOR+'s random features (from torch's global generator)."""
        rows, dim = self.projection.shape
        # A new tensor, not an in-place copy: a graph that still holds the old features stays valid.
        self.projection = orthogonal_random_features(rows, dim).to(self.projection)
        self.forwards_since_redraw.zero_()

    def _phi(self, x: torch.Tensor, is_query: bool, workspace: dict | None = None) -> torch.Tensor:
        if self.feature_map == "elu":
            return _elu(x, is_query, workspace)
        if self.feature_map == "relu":
            return relu_feature_map(x)
        if self.projection is None:
            raise ValueError("feature_map 'favor' draws its features in setup_heads(HeadLayout(...)); call it first")
        return favor_feature_map(x, self.projection, is_query)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        causal, key_padding_mask, dropout_p = call.causal, call.key_padding_mask, call.dropout_p
        need_weights = call.need_weights
        if causal and q.shape[2] != k.shape[2]:
            raise ValueError(
                f"causal linear attention needs as many queries as keys, got {q.shape[2]} and {k.shape[2]}"
            )
        if self.training and self.projection is not None and self.redraw_interval is not None:
            if int(self.forwards_since_redraw) >= self.redraw_interval:
                self.redraw_features()
            self.forwards_since_redraw += 1
        if need_weights:
            return quadratic_linear_attention(
                q, k, v, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p, feature_map=self._phi
            )
        chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
        if causal and use_fast_kernels() and q.shape[2] > fast_linear.SEGMENT_LENGTH:
            features = functools.partial(_features, dropout_p=dropout_p, feature_map=self._phi)
            attend = functools.partial(causal_linear_attention, chunk_size=chunk, normalise=True)
            return fast_linear.causal_segments(q, k, v, key_padding_mask, chunk, features, attend), None
        favor = self.feature_map == "favor" and self.projection is not None
        if not causal and favor and use_fast_kernels() and fast_linear.favor_applies(q, self.projection, dropout_p):
            return fast_linear.favor_bidirectional(q, k, v, self.projection, key_padding_mask), None
        phi_q, phi_k, values = _features(q, k, v, key_padding_mask, dropout_p, self._phi)
        if causal:
            return causal_linear_attention(phi_q, phi_k, values, chunk, normalise=True)[0], None
        return _bidirectional(phi_q, phi_k, values), None

    def new_cache(self) -> LinearAttentionState:
        return LinearAttentionState()

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LinearAttentionState, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New tokens (B, H, t, D), keys/values (B, G, t, D) continue the recurrence from `cache.state`
        (B, G, F, D + 1) (Katharopoulos et al. eq. 18-20). The features never change while decoding."""
        key_padding_mask, need_weights = call.key_padding_mask, call.need_weights
        if need_weights:
            raise ValueError("need_weights is not available when decoding with variant 'linear' (no keys are kept)")
        phi_q, phi_k, values = _features(q, k, v, new_tokens_padding(key_padding_mask, k.shape[2]), 0.0, self._phi)
        chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
        out, cache.state = causal_linear_attention(phi_q, phi_k, values, chunk, cache.state, normalise=True)
        cache.offset += k.shape[2]
        return out, None
