"""Memory-compressed attention (Linformer, Wang et al. 2020): keys and values projected along the sequence.

Learned matrices E, F (k x n) take the n keys and values to k rows (section 4, eq. 7):

    out = softmax(q (E K)^T / sqrt(d)) (F V)        O(n k) time and memory instead of O(n^2)

shared by all heads by default (the paper's headwise sharing; `share_projection=False` gives each head its
own). A sequence shorter than the model's maximum length n uses the first columns of E and F, as the
paper's code does. An approximation of softmax attention, not equal to it (the tests report the error); it
needs the maximum length, and a compressed key mixes past and future tokens, so it is bidirectional only.

Padded keys and values are zeroed before the projection; a compressed slot that mixes no real key (E
restricted to the real tokens is zero there, as for the identity beyond the input) is masked.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.attention.contract import AttentionCall, HeadLayout, Kernel, TokenLayout
from zoo.attention.functional import masked_attention, repeat_kv
from zoo.errors import check_positive_int

DEFAULT_COMPRESSION = 4  # compressed_length null: max_length / 4 rows (the paper's k = 128 at n = 512)


class CompressedAttention(Kernel):
    """Linformer attention, bidirectional only; parameters `key_projection` (E) and `value_projection` (F),
    (k, max_length), or (heads, k, max_length) without sharing.

    need_weights returns the effective weights of the input tokens' values, (softmax(...) F)[:, :n]: out
    equals weights @ v, but the weights need not be positive.

    Args:
        compressed_length: k, the rows keys and values are projected to; None: ceil(max_length / 4).
        share_projection: one E and one F for all heads (False: one per head).
    """

    name = "compressed"
    supports_cross_attention = False
    supports_causal = False
    supports_decoding = False
    example_options = ({"compressed_length": 6}, {"share_projection": False})

    def __init__(self, *, compressed_length: int | None = None, share_projection: bool = True) -> None:
        super().__init__()
        check_positive_int("attention.compressed_length (variant 'compressed')", compressed_length, allow_none=True)
        if not isinstance(share_projection, bool):
            raise ValueError(f"attention.share_projection must be true or false, got {share_projection!r}")
        self.compressed_length = compressed_length
        self.share_projection = share_projection

    def setup(self, layout: TokenLayout) -> None:
        super().setup(layout)
        if layout.max_length is None:
            raise ValueError(
                "attention variant 'compressed' projects keys along the sequence and needs the model's maximum "
                "length, which this attention was not told (cross-attention memories have none); valid: bidirectional "
                "self-attention in a model that gives its length (ViT, CLIP's image tower, the translation encoder)"
            )
        self.max_length = layout.max_length
        self.rows = self.compressed_length or -(-layout.max_length // DEFAULT_COMPRESSION)

    def setup_heads(self, heads: HeadLayout) -> None:
        super().setup_heads(heads)
        num_heads = heads.num_heads  # grouped key/value heads are expanded first: every query head has its E, F
        shape = (self.rows, self.max_length) if self.share_projection else (num_heads, self.rows, self.max_length)
        self.key_projection = nn.Parameter(torch.empty(shape))
        self.value_projection = nn.Parameter(torch.empty(shape))
        # Xavier-uniform with gain 1/sqrt(2), as fairseq's Linformer initialises its compression layers.
        bound = math.sqrt(6.0 / (self.rows + self.max_length)) / math.sqrt(2.0)
        for projection in (self.key_projection, self.value_projection):
            nn.init.uniform_(projection, -bound, bound)

    def extra_repr(self) -> str:
        return f"compressed_length={self.rows}, max_length={self.max_length}, share_projection={self.share_projection}"

    def new_cache(self):
        raise ValueError("attention variant 'compressed' is bidirectional only: it has no decoding cache")

    def _project(self, projection: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(k, n) or (H, k, n) times x (B, H, n, D) -> (B, H, k, D)."""
        if projection.ndim == 3:
            return torch.einsum("hkn,bhnd->bhkd", projection, x)
        batch, heads, length, dim = x.shape
        folded = x.transpose(1, 2).reshape(batch, length, heads * dim)  # one (k, n) x (n, H D) product per batch
        return torch.matmul(projection, folded).view(batch, -1, heads, dim).transpose(1, 2)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        causal, key_padding_mask, dropout_p = call.causal, call.key_padding_mask, call.dropout_p
        need_weights = call.need_weights
        length = k.shape[2]
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # no cache here, so nothing to save by keeping G heads
        if causal:
            raise ValueError("attention variant 'compressed' is bidirectional only, got causal=True")
        if length > self.max_length:
            raise ValueError(
                f"attention variant 'compressed' projects at most the model's max_length={self.max_length} "
                f"keys, got {length}; valid: 1..{self.max_length}"
            )
        key_projection = self.key_projection[..., :length]
        value_projection = self.value_projection[..., :length]
        real = torch.ones(k.shape[0], length, dtype=k.dtype, device=k.device)
        if key_padding_mask is not None:
            padding = key_padding_mask.bool()
            k = k.masked_fill(padding[:, None, :, None], 0.0)
            v = v.masked_fill(padding[:, None, :, None], 0.0)
            real = real.masked_fill(padding, 0.0)
        # A slot is attended only if it mixes some real key: (B, 1 | H, 1, k).
        magnitude = key_projection.detach().abs()
        if magnitude.ndim == 2:
            allowed = (real @ magnitude.T > 0)[:, None, None, :]
        else:
            allowed = (torch.einsum("bn,hkn->bhk", real, magnitude) > 0)[:, :, None, :]
        keys, values = self._project(key_projection, k), self._project(value_projection, v)
        if not torch.compiler.is_exporting() and bool(allowed.all()):  # torch.export cannot branch on values
            allowed = None  # the usual case: one fused SDPA call without a mask
        out, probs = masked_attention(q, keys, values, allowed, dropout_p, need_weights)
        if not need_weights:
            return out, None
        weights = torch.matmul(probs, value_projection)  # (B, H, T, n): out = weights @ v
        if key_padding_mask is not None:
            weights = weights.masked_fill(padding[:, None, None, :], 0.0)
        return out, weights
