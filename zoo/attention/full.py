"""Full softmax attention through PyTorch's fused scaled_dot_product_attention."""

from __future__ import annotations

import torch

from zoo.attention.cache import KVCache, new_tokens_padding
from zoo.attention.contract import AttentionCall, Kernel
from zoo.attention.fast import bias as fast_bias
from zoo.attention.fast import use_fast_kernels
from zoo.attention.flex import auto_uses_flex_bias, flex_bias_attention
from zoo.attention.functional import dot_product_attention, evaluate_bias


class FullAttention(Kernel):
    """softmax(q k^T / sqrt(d) + bias) v over all keys: O(n^2) time, fused kernels keep memory O(n) (a position
    bias is an (H, n, n) float mask in the formula; the CPU fast path and CUDA compute it inside the kernel). No
    options. Backend: sdpa (auto is sdpa): without padding, weights or bias it is one call with is_causal and no
    mask, which keeps CUDA on the flash kernel (a mask would drop it to the math path); with ALiBi or T5 on CUDA,
    auto takes FlexAttention with the bias as its score_mod (zoo/attention/flex.py)."""

    name = "full"
    supports_cross_attention = True
    supports_position_bias = True
    supports_packing = True
    backends = ("sdpa",)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, H, T, D), k/v (B, G, S, D) -> (B, H, T, D) and, if asked, probabilities (B, H, T, S)."""
        bias, causal, mask = call.bias, call.causal, call.key_padding_mask
        dropout_p, need_weights = call.dropout_p, call.need_weights
        if bias is not None and self.backend == "auto" and auto_uses_flex_bias(q, k, bias, dropout_p, need_weights):
            return flex_bias_attention(q, k, v, bias, causal=causal, key_padding_mask=mask), None  # CUDA: score_mod
        if bias is not None and use_fast_kernels() and fast_bias.applies(q, k, bias, dropout_p, need_weights):
            # the bias per query block from a table over distances, never (H, n, n) nor per batch element
            return fast_bias.relative_bias_attention(q, k, v, bias, causal=causal, key_padding_mask=mask), None
        scores_bias = None if bias is None else evaluate_bias(bias, q.shape[2], k.shape[2], q.device)
        return dot_product_attention(
            q, k, v, causal=causal, key_padding_mask=mask, dropout_p=dropout_p, need_weights=need_weights,
            bias=scores_bias,
        )  # fmt: skip

    def new_cache(self) -> KVCache:
        return KVCache()

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New queries (B, H, t, D) and keys/values (B, G, t, D) attend causally to the cache plus themselves.

        key_padding_mask: (B, t) for the new tokens or (B, offset + t); the cache keeps past padding.
        The cache holds every key from position 0, so the bias rows are those of positions offset ... offset + t - 1.
        Weights, if asked, cover all keys so far: (B, H, t, offset + t).
        """
        keys, values = cache.append(k, v, new_tokens_padding(call.key_padding_mask, k.shape[2]))
        bias = None if call.bias is None else evaluate_bias(call.bias, q.shape[2], keys.shape[2], q.device)
        return dot_product_attention(
            q, keys, values, causal=True, key_padding_mask=cache.key_padding_mask(), need_weights=call.need_weights,
            bias=bias,
        )  # fmt: skip
