"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

With a positive feature map phi(x) = elu(x) + 1 in place of exp(q . k), attention factorises
(eq. 4-6):  out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j).
Bidirectional: one pass in O(n d^2). Causal: the sums run over j <= i; computed in chunks, with a
quadratic causal product inside each chunk and the state of all earlier chunks from one cumulative
sum over per-chunk states (no loop over tokens or chunks). Decoding keeps only [S | z] (eq. 18-20).

The denominator rides along as an extra column of ones appended to v, so one matmul yields both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo.attention.cache import LinearAttentionState, new_tokens_padding
from zoo.attention.contract import Kernel
from zoo.errors import check_positive_int

EPS = 1e-6  # added to the normaliser, as in the paper's code
# Tokens per chunk of the causal kernel, chosen by measurement (experiments/results/recipes.md): smaller
# chunks mean more per-chunk states, larger ones a bigger quadratic part.
DEFAULT_CHUNK_SIZE = 64


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0), and its derivative min(elu(x) + 1, 1): exp(x) below
    zero, 1 above. Faster than F.elu(x) + 1 in both directions (experiments/results/recipes.md)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # Contiguous output (x is often a strided view of the fused projection), and as few fresh
        # allocations as possible: on the CPU each large one costs page faults.
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
        negative_part = y.clamp(max=0.0).exp_()
        y.clamp_(min=0.0).add_(negative_part)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y.clamp(max=1.0).mul_(grad)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020, eq. 7)."""
    return _EluPlusOne.apply(x)


def _features(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """phi(q), phi(k) with padded keys zeroed (they contribute nothing), and [v | 1].

    Attention dropout: a kept key's value is scaled by 1 / (1 - p), a dropped one zeroed, in the
    numerator only. This is dropout on the implicit normalised weights with one mask per key and head
    shared by all queries (per-entry masks would need the n x n matrix); like softmax attention
    dropout it leaves the expected output unchanged.
    """
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    if key_padding_mask is not None:
        phi_k = phi_k.masked_fill(key_padding_mask.bool()[:, None, :, None], 0.0)
    if dropout_p > 0.0:
        keep = torch.empty(v.shape[:-1] + (1,), dtype=v.dtype, device=v.device).bernoulli_(1.0 - dropout_p)
        v = v * keep / (1.0 - dropout_p)
    values = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # (B, H, S, D + 1)
    return phi_q, phi_k, values


def _normalise(out: torch.Tensor) -> torch.Tensor:
    """[numerator | denominator] (..., D + 1) -> numerator / (denominator + eps)."""
    return out[..., :-1] / (out[..., -1:] + EPS)


def quadratic_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same attention through the explicit (T, S) matrix phi(q) phi(k)^T (eq. 4): the reference,
    and the normalised weights (B, H, T, S) for need_weights. Causal queries sit at the last positions."""
    phi_q, phi_k, values = _features(q, k, v, key_padding_mask, dropout_p)
    scores = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    if causal:
        q_len, k_len = q.shape[2], k.shape[2]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, 0.0)
    weights = scores / (scores.sum(dim=-1, keepdim=True) + EPS)
    return weights @ values[..., :-1], weights


def _bidirectional(phi_q: torch.Tensor, phi_k: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """O(n d^2): [S | z] = phi(K)^T [V | 1] once, then phi(Q) [S | z]."""
    return phi_q @ (phi_k.transpose(-2, -1) @ values)


def causal_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    values: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked causal linear attention on features: (B, H, T, D), (B, H, T, D), (B, H, T, E).

    `state` (B, H, D, E) sums the tokens before this call. Returns the unnormalised [numerator |
    denominator] (B, H, T, E) and the state after the last token.
    """
    batch, heads, length, dim = phi_q.shape
    width = values.shape[-1]
    chunk = max(1, min(chunk_size, length))
    n_chunks = -(-length // chunk)
    padded = n_chunks * chunk
    if padded != length:  # zero features: padding contributes nothing, its outputs are dropped
        pad = (0, 0, 0, padded - length)
        phi_q, phi_k, values = F.pad(phi_q, pad), F.pad(phi_k, pad), F.pad(values, pad)
    # (B * H * nc, C, .): the chunks as one batch of small matrices.
    q_chunks = phi_q.reshape(-1, chunk, dim)
    k_chunks = phi_k.reshape(-1, chunk, dim)
    v_chunks = values.reshape(-1, chunk, width)
    # Inside a chunk: the quadratic form with a causal mask, (C, C) per chunk.
    scores = torch.bmm(q_chunks, k_chunks.transpose(1, 2)).tril_()
    # Across chunks: each chunk's phi(K)^T [V | 1], summed over all earlier chunks.
    chunk_states = torch.bmm(k_chunks.transpose(1, 2), v_chunks).view(batch, heads, n_chunks, dim, width)
    sum_dtype = torch.promote_types(chunk_states.dtype, torch.float32)  # long sums in fp32 also for bf16
    inclusive = chunk_states.cumsum(dim=2, dtype=sum_dtype)
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :, :1]), inclusive[:, :, :-1]], dim=2)
    final = inclusive[:, :, -1]
    if state is not None:
        exclusive = exclusive + state[:, :, None]
        final = final + state
    exclusive = exclusive.to(phi_q.dtype).reshape(-1, dim, width)
    out = torch.bmm(scores, v_chunks).baddbmm_(q_chunks, exclusive)  # intra + inter, (B * H * nc, C, E)
    return out.reshape(batch, heads, padded, width)[:, :, :length], final


class LinearAttention(Kernel):
    """Linear attention with the elu + 1 feature map; a recurrent state of O(1) memory for decoding.

    Option `chunk_size`: the chunk length of the causal kernel (None: the measured default, 64).
    need_weights returns the explicit normalised weights phi(q_i) . phi(k_j) / sum_j(...) from the
    quadratic formula, materialising (T, S): for inspecting small inputs only.
    """

    name = "linear"
    supports_cross_attention = True

    def __init__(self, *, chunk_size: int | None = None) -> None:
        super().__init__()
        check_positive_int("attention.chunk_size", chunk_size, allow_none=True)
        self.chunk_size = chunk_size

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if causal and q.shape[2] != k.shape[2]:
            raise ValueError(
                f"causal linear attention needs as many queries as keys, got {q.shape[2]} and {k.shape[2]}"
            )
        if need_weights:
            return quadratic_linear_attention(
                q, k, v, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p
            )
        phi_q, phi_k, values = _features(q, k, v, key_padding_mask, dropout_p)
        if causal:
            out, _ = causal_linear_attention(phi_q, phi_k, values, self.chunk_size or DEFAULT_CHUNK_SIZE)
        else:
            out = _bidirectional(phi_q, phi_k, values)
        return _normalise(out), None

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New tokens (B, H, t, D) continue the recurrence from `cache.state` (Katharopoulos et al. eq. 18-20)."""
        if need_weights:
            raise ValueError("need_weights is not available when decoding with variant 'linear' (no keys are kept)")
        phi_q, phi_k, values = _features(q, k, v, new_tokens_padding(key_padding_mask, k.shape[2]), 0.0)
        chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
        out, cache.state = causal_linear_attention(phi_q, phi_k, values, chunk, cache.state)
        cache.offset += k.shape[2]
        return _normalise(out), None
