"""FlexAttention (torch.nn.attention.flex_attention) as the block-sparse backend of the pattern kernels.

A kernel's pattern (query position, key position) -> may attend becomes a `mask_mod`; `create_block_mask`
turns it into a BlockMask of 128 x 128 tiles, and the compiled flex_attention visits only the tiles that
hold an allowed pair, applying the mask inside partial tiles only. This is the backend `attention.backend=
auto` picks on CUDA for local, sparse and axial attention (full attention stays on SDPA's flash kernel);
on the CPU FlexAttention has no backward, and forward the blockwise kernels measured faster
(experiments/results/recipes.md), so there `flex` is chosen only when forced. No position bias and no
attention dropout here: AttentionConfig rejects `backend=flex` with either, and `auto` keeps the blockwise
path for them.

Full attention with ALiBi or T5 on CUDA: `auto` computes the bias inside FlexAttention as a `score_mod`
(`position_bias_score_mod`): ALiBi in closed form from the positions, T5 as its table over distances, a captured
tensor whose gradient FlexAttention returns (and autograd sums by bucket into the embedding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from zoo.attention.biases import ALiBi, T5RelativeBias, constant_beyond, distance_table

BLOCK_MASKS_KEPT = 4  # lengths whose block masks a kernel keeps (training repeats the same length)

# (query positions, key positions) int tensors -> bool, True = may attend: a kernel's pattern.
Pattern = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def auto_uses_flex(q: torch.Tensor, dropout_p: float, bias: object | None) -> bool:
    """What `auto` means for a pattern kernel: flex on CUDA (where its block-sparse tiles win), without bias
    or dropout, which flex does not take."""
    return q.device.type == "cuda" and dropout_p == 0.0 and bias is None and flex_available()


def check_flex_inputs(dropout_p: float, bias: object | None) -> None:
    """FlexAttention here takes no attention dropout and no position bias: a one-line error if forced with them."""
    if dropout_p > 0.0 or bias is not None:
        raise ValueError(
            f"backend 'flex' takes no attention dropout and no position bias, got dropout_p={dropout_p}, "
            f"bias={type(bias).__name__ if bias is not None else None}; use backend auto or blockwise"
        )


def resolve_backend(
    kernel_name: str, backend: str, q: torch.Tensor, k: torch.Tensor, dropout_p: float, bias, need_weights: bool
) -> str:
    """The backend a self-attention-only pattern kernel (local, sparse, axial) runs for this call: `auto`
    resolved by device, flex checked for what it cannot take; need_weights always takes the dense formula's
    path (flex gives no probabilities)."""
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            f"{kernel_name} attention needs as many queries as keys (self-attention), got {q.shape[2]} and {k.shape[2]}"
        )
    if backend == "auto":
        backend = "flex" if auto_uses_flex(q, dropout_p, bias) else "blockwise"
    if backend == "flex":
        if need_weights:
            return "blockwise"
        check_flex_inputs(dropout_p, bias)
    return backend


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process; uncompiled it materialises the (n, n) scores."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _block_mask(pattern: Pattern, padding: torch.Tensor | None, batch: int, length: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    if padding is None:

        def mask_mod(b, h, q_idx, kv_idx):
            return pattern(q_idx, kv_idx)
    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return pattern(q_idx, kv_idx) & ~padding[b, kv_idx]

    # _compile builds the mask tile by tile; uncompiled it evaluates the whole (n, n) mask at once.
    return create_block_mask(
        mask_mod, batch if padding is not None else None, None, length, length, device=device,
        _compile=device.type == "cuda",
    )  # fmt: skip


def flex_pattern_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: Pattern,
    cache: dict,
    cache_key: tuple,
    key_padding_mask: torch.Tensor | None = None,
    attend: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Self-attention of q (B, H, n, D) over k, v (B, G, n, D) under `pattern`, through flex_attention.

    `cache` (a kernel's dict) keeps the block masks of the last few `cache_key`s when there is no padding;
    `attend` is the flex_attention to call (default: the compiled one). Rows with no allowed key output zeros.
    """
    batch, length = q.shape[0], q.shape[2]
    padding = None if key_padding_mask is None else key_padding_mask.bool()
    key = (*cache_key, length, q.device)
    if padding is None and key in cache:
        block_mask = cache[key]
    else:
        block_mask = _block_mask(pattern, padding, batch, length, q.device)
        if padding is None:
            if len(cache) >= BLOCK_MASKS_KEPT:
                cache.pop(next(iter(cache)))
            cache[key] = block_mask
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(
            "backend 'flex' has no backward on the CPU (PyTorch's FlexAttention); use backend auto or blockwise "
            "for training on the CPU, flex under torch.no_grad()"
        )
    attend = attend or compiled_flex_attention()
    return attend(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


# (score, batch, head, query index, key index) -> score: FlexAttention's score_mod, applied inside the kernel.
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def alibi_score_mod(slopes: torch.Tensor) -> ScoreMod:
    """ALiBi (Press et al. 2022): score - m_h |i - j|, slopes (H,)."""

    def score_mod(score, batch, head, q_idx, kv_idx):
        return score - slopes[head] * (q_idx - kv_idx).abs()

    return score_mod


def distance_table_score_mod(table: torch.Tensor, reach: int) -> ScoreMod:
    """A bias of the distance only: score + table[h, clamp(j - i, -reach, reach) + reach] (biases.distance_table)."""

    def score_mod(score, batch, head, q_idx, kv_idx):
        return score + table[head, (kv_idx - q_idx).clamp(-reach, reach) + reach]

    return score_mod


def position_bias_score_mod(bias, length: int, device: torch.device) -> ScoreMod:
    """The score_mod of a position bias module for sequences of `length` (T5's table built here, under autograd)."""
    if isinstance(bias, ALiBi):
        return alibi_score_mod(bias.slopes.to(device))
    reach = constant_beyond(bias, length)
    return distance_table_score_mod(distance_table(bias, reach, device).float(), reach)


def auto_uses_flex_bias(q: torch.Tensor, k: torch.Tensor, bias, dropout_p: float, need_weights: bool) -> bool:
    """What `auto` means for full attention with a position bias: FlexAttention with the bias as its score_mod on
    CUDA (self-attention, ALiBi or T5, no dropout, no weights asked)."""
    return (
        q.device.type == "cuda"
        and isinstance(bias, (ALiBi, T5RelativeBias))
        and q.shape[2] == k.shape[2]
        and dropout_p == 0.0
        and not need_weights
        and flex_available()
    )


def flex_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attend: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Full self-attention of q (B, H, n, D) over k, v (B, G, n, D) with a position bias inside FlexAttention: the
    bias as score_mod, causality and padding as the block mask (tiles wholly masked are skipped). `attend`: the
    flex_attention to call (default: the compiled one)."""
    batch, length = q.shape[0], q.shape[2]
    score_mod = position_bias_score_mod(bias, length, q.device)
    block_mask = None
    if causal or key_padding_mask is not None:

        def pattern(q_idx, kv_idx):
            return kv_idx <= q_idx if causal else kv_idx >= 0

        padding = None if key_padding_mask is None else key_padding_mask.bool()
        block_mask = _block_mask(pattern, padding, batch, length, q.device)
    attend = attend or compiled_flex_attention()
    return attend(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
