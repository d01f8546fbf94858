"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

With a non-negative feature map phi in place of exp(q . k / sqrt(d)) (zoo/attention/feature_maps.py: elu + 1,
ReLU, or Performer's FAVOR+ random features), attention factorises (eq. 4-6):
out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j).
Bidirectional: one pass in O(n F d) (F features per head). Causal: the sums run over j <= i; computed in
chunks, with a quadratic causal product inside each chunk and the state of all earlier chunks from one
prefix sum over per-chunk states (no loop over tokens). Decoding keeps only [S | z] (eq. 18-20),
per key/value head (grouped-query attention shares one state among the query heads of a group).

The denominator phi(q_i)^T z comes from the same chunks as the numerator (row sums of the intra-chunk
scores, phi(q) . z of earlier chunks): no column of ones is appended to v, which would cost a copy of v
and a width of D + 1 that matmuls handle worse.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from zoo.attention.cache import LinearAttentionState, new_tokens_padding
from zoo.attention.contract import HeadLayout, Kernel
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

EPS = 1e-6  # added to the normaliser, as in the paper's code
# Tokens per chunk of the causal kernel, chosen by measurement (experiments/results/recipes.md): smaller
# chunks mean more per-chunk states, larger ones a bigger quadratic part.
DEFAULT_CHUNK_SIZE = 64
# Tokens per segment of a long causal sequence: the feature maps and the chunked kernel run a segment at a
# time, carrying the state [S | z] from one to the next (the recurrence of decoding), so that the working set
# of each step stays in cache and the time per token does not grow with n. Measured (1 thread, 4 heads of 64):
# n=32768 forward 289 -> 184 ms, forward+backward 1001 -> 681 ms; 1024 and 4096 no better.
SEGMENT_LENGTH = 2048

# phi(x, is_query, workspace): queries and keys may be mapped differently (FAVOR+ stabilises queries only);
# `workspace` (or None): scratch tensors to write into, see `_scratch`.
FeatureMap = Callable[[torch.Tensor, bool, "dict | None"], torch.Tensor]


def _scratch(workspace: dict | None, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
    """A scratch tensor of `shape` that the segments of one long causal call without autograd reuse (on the CPU
    every large fresh tensor costs page faults: ~2,000-4,000 per forward at n=8192, 10-20 ms, and the main
    source of its run-to-run spread); None without a workspace (allocate as usual)."""
    if workspace is None:
        return None
    buffer = workspace.get(name)
    if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype:
        buffer = workspace[name] = like.new_empty(shape)
    return buffer


def _elu(x: torch.Tensor, is_query: bool, workspace: dict | None = None) -> torch.Tensor:
    if workspace is None:
        return elu_feature_map(x)
    role = "phi_q" if is_query else "phi_k"
    return elu_feature_map(x, _scratch(workspace, role, x.shape, x), _scratch(workspace, "negative", x.shape, x))


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
    weights = scores / (scores.sum(dim=-1, keepdim=True) + EPS)
    return weights @ values, weights


def _bidirectional(phi_q: torch.Tensor, phi_k: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """O(n F d): S = phi(K)^T V and z = sum_j phi(k_j) once per key/value head, then phi(Q) S / phi(Q) z for
    its query heads."""
    batch, heads, length, features = phi_q.shape
    kv_heads = phi_k.shape[1]
    state = phi_k.transpose(-2, -1) @ values  # (B, G, F, D)
    z = phi_k.sum(dim=2)[..., None]  # (B, G, F, 1)
    grouped = phi_q.reshape(batch, kv_heads, (heads // kv_heads) * length, features)  # query heads of a group
    out = (grouped @ state) / (grouped @ z + EPS)
    return out.view(batch, heads, length, -1)


class _ExclusivePrefixSum(torch.autograd.Function):
    """Sums over all earlier chunks, starting from `initial`: (N, nc, F), (N, F) -> (N, nc, F), out_0 = initial,
    out_c = out_(c-1) + x_(c-1): one add per chunk written straight into its row (on the CPU torch.cumsum along
    the middle dimension is a strided scalar scan ~3x slower, and its backward flips the gradient twice;
    profile in experiments/results/recipes.md). The backward is the same recurrence from the other end."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, initial: torch.Tensor | None) -> torch.Tensor:
        ctx.has_initial = initial is not None
        return _exclusive_scan(x, initial, torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # d out_c / d x_j = 1 for every c > j: grad_x_j = grad_x_(j+1) + grad_(j+1), and initial feeds every row.
        grad = grad.contiguous()
        grad_x = torch.empty_like(grad)
        grad_x[:, -1].zero_()
        for index in reversed(range(grad.shape[1] - 1)):
            torch.add(grad_x[:, index + 1], grad[:, index + 1], out=grad_x[:, index])
        return grad_x, (grad_x[:, 0] + grad[:, 0]) if ctx.has_initial else None


def _exclusive_scan(x: torch.Tensor, initial: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    if initial is None:
        out[:, 0].zero_()
    else:
        out[:, 0].copy_(initial)
    for index in range(1, x.shape[1]):
        torch.add(out[:, index - 1], x[:, index - 1], out=out[:, index])
    return out


def exclusive_prefix_sum(
    x: torch.Tensor, initial: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, nc, F), optional (N, F): `initial` plus the sum of the chunks before each chunk. Wide rows on the
    CPU take the loop above (written into `out`, x's shape, if given, without autograd); narrow ones (z's,
    F = head dim) and other devices one cumsum, shifted by a row."""
    if x.device.type == "cpu" and x.shape[-1] >= 1024:
        if out is not None and not torch.is_grad_enabled():
            return _exclusive_scan(x, initial, out)
        return _ExclusivePrefixSum.apply(x, initial)
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
    [S | z] (B, G, D, E + 1) and the output numerator / (phi(q) . z + eps), the denominator taken from the
    same chunks (row sums of the intra-chunk scores, phi(q) . z of the earlier chunks) instead of from a
    column of ones appended to the values (one copy of the values fewer, and E stays matmul-aligned).
    `out` (normalise, no autograd, whole chunks only): a (B, H, T, E) view the output is written into, e.g. a
    segment of a longer output (no joining copy afterwards). `workspace` (no autograd): a dict of scratch tensors
    (`_scratch`) that the calls for one sequence's segments share.
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
    states_out = _scratch(workspace, "states", (k_chunks.shape[0], dim, width), phi_k)
    chunk_states = torch.bmm(k_chunks.transpose(1, 2), v_chunks, out=states_out)
    chunk_states = chunk_states.view(batch * kv_heads, n_chunks, dim * width)
    chunk_states = chunk_states.to(sum_dtype)
    prior = None if state is None else (state[..., :width] if normalise else state)
    prior = None if prior is None else prior.reshape(batch * kv_heads, dim * width).to(sum_dtype)
    exclusive_out = _scratch(workspace, "exclusive", chunk_states.shape, chunk_states)
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
        q_chunks, k_chunks.transpose(1, 2), out=_scratch(workspace, "scores", (rows, chunk, chunk), phi_q)
    )
    scores = scores.tril_()
    numerator = torch.bmm(scores, v_chunks, out=_scratch(workspace, "numerator", (rows, chunk, width), values))
    numerator = numerator.baddbmm_(q_chunks, exclusive)  # intra + inter, (B * H * nc, C, E)
    if not normalise:
        return numerator.reshape(batch, heads, padded, width)[:, :, :length], final
    # (B * H * nc, C, 1): intra-chunk row sums plus phi(q) . z of the earlier chunks (a product and a sum:
    # ~3x faster than baddbmm's matrix-vector products, 128 of them per segment).
    product = _scratch(workspace, "product", q_chunks.shape, q_chunks)
    denominator = torch.mul(q_chunks, exclusive_z.reshape(-1, 1, dim), out=product).sum(dim=-1, keepdim=True)
    denominator = denominator.add_(scores.sum(dim=-1, keepdim=True)).add_(EPS)
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

    Options: `chunk_size` (the chunk length of the causal kernel; None: the measured default, 64),
    `feature_map` (elu | relu | favor, zoo/attention/feature_maps.py), and for favor `num_features` (random
    features per head; None: Performer's head_dim * ln(head_dim)) and `redraw_interval` (training forward
    passes between fresh draws of the features, as Performer's feature_redraw_interval; None: never). The
    features are a buffer: fixed in eval and in decoding, and saved in checkpoints.
    need_weights returns the explicit normalised weights phi(q_i) . phi(k_j) / sum_j(...) from the
    quadratic formula, materialising (T, S): for inspecting small inputs only.
    """

    name = "linear"
    supports_cross_attention = True
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
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        bias: None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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
        if causal:
            return self._causal_segments(q, k, v, key_padding_mask, dropout_p), None
        phi_q, phi_k, values = _features(q, k, v, key_padding_mask, dropout_p, self._phi)
        return _bidirectional(phi_q, phi_k, values), None

    def _causal_segments(self, q, k, v, key_padding_mask, dropout_p) -> torch.Tensor:
        """The causal kernel SEGMENT_LENGTH tokens at a time, each segment continuing the state of the last
        (split, not sliced: the backward then joins the segments' gradients in one copy instead of one
        full-size zero tensor per segment). Without autograd each segment of whole chunks is written into its
        part of the output: no joining copy (forward at n=32768 7% faster, recipes.md)."""
        chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
        segment = max(chunk, SEGMENT_LENGTH // chunk * chunk)  # whole chunks: the same chunks as one pass
        pieces = [x.split(segment, dim=2) for x in (q, k, v)]
        masks = key_padding_mask.split(segment, dim=1) if key_padding_mask is not None else [None] * len(pieces[0])
        direct = len(pieces[0]) > 1 and not torch.is_grad_enabled()
        joined = q.new_empty(q.shape[:3] + v.shape[-1:]) if direct else None
        workspace = {} if direct else None  # the segments' scratch tensors, allocated once (`_scratch`)
        outs, state, start = [], None, 0
        for q_part, k_part, v_part, padding in zip(*pieces, masks):
            phi_q, phi_k, values = _features(q_part, k_part, v_part, padding, dropout_p, self._phi, workspace)
            end = start + q_part.shape[2]
            whole = direct and q_part.shape[2] % chunk == 0
            target = joined[:, :, start:end] if whole else None
            out, state = causal_linear_attention(
                phi_q, phi_k, values, chunk, state, normalise=True, out=target, workspace=workspace
            )
            if direct and not whole:  # the last segment's partial chunk: computed apart, then copied in
                joined[:, :, start:end] = out
            elif not direct:
                outs.append(out)
            start = end
        if direct:
            return joined
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def new_cache(self) -> LinearAttentionState:
        return LinearAttentionState()

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: LinearAttentionState,
        *,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        bias: None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New tokens (B, H, t, D), keys/values (B, G, t, D) continue the recurrence from `cache.state`
        (B, G, F, D + 1) (Katharopoulos et al. eq. 18-20). The features never change while decoding."""
        if need_weights:
            raise ValueError("need_weights is not available when decoding with variant 'linear' (no keys are kept)")
        phi_q, phi_k, values = _features(q, k, v, new_tokens_padding(key_padding_mask, k.shape[2]), 0.0, self._phi)
        chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
        out, cache.state = causal_linear_attention(phi_q, phi_k, values, chunk, cache.state, normalise=True)
        cache.offset += k.shape[2]
        return out, None
