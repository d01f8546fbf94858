"""Relative position biases added to the attention scores: ALiBi and T5's learned bucketed bias.

Both are ScoreBias modules (the contract: zoo/attention/contract.py): bias(query_positions, key_positions)
-> (..., H, Tq, Tk), added to q . k / sqrt(d) before the softmax. They depend on the distance between query
and key only, so a model that uses one needs no absolute position table, and they are defined for any
distance: a model may run past the length it was trained on.

- ALiBi (Press et al. 2022, "Train Short, Test Long"): -m_h |i - j|, a fixed slope m_h per head. Causal
  attention sees only j <= i, where this is the paper's -m_h (i - j); bidirectional attention gets the
  symmetric penalty (the usual extension of the causal definition).
- T5 (Raffel et al. 2020, section 2.1): a learned scalar per head and distance bucket (nn.Embedding
  `relative_attention_bias`, named as in T5). Causal (decoder) bucketing spends every bucket on keys at or
  before the query; bidirectional (encoder) bucketing half on each side. As in T5 the 1/sqrt(d) scaling of
  the scores is kept (T5 folds it into its initialisation; zoo's kernels always scale).

Both depend on j - i only: `distance_table` writes a bias as a table over distances, T5's ending where its last
buckets begin (`constant_beyond`), from which a kernel takes the slice of any block of queries (full attention's
CPU path, zoo/attention/fast/bias.py) or a FlexAttention score_mod reads its entries (zoo/attention/flex.py).

Sharing: T5 computes one bias in the first layer and reuses it in every layer of a stack; zoo shares the
module instead (attention.share_bias, built once per stack by zoo.nn.blocks.transformer_stack, registered in
every layer's attention like tied weights), or gives each layer its own (share_bias=false). FSDP wraps every
TransformerBlock as its own unit (trainer=fsdp) and is known to mishandle parameters shared between units
(pytorch/pytorch#83052): use share_bias=false there.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.errors import check_choice

POSITION_BIASES = ("alibi", "t5")


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The per-head slopes of Press et al. 2022 (their code), (H,) float32.

    For n heads, n a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the
    slopes of the largest power of two p below n, then every other slope of 2p's sequence, n - p of them.
    """

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    power = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(power)
    if power != num_heads:
        slopes += geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(nn.Module):
    """Attention with linear biases: score bias -m_h |i - j| (Press et al. 2022). No parameters."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        # Not a buffer, so that model.half() cannot round the slopes; moved to the positions' device per call.
        self.slopes = alibi_slopes(num_heads)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Positions (..., Tq), (..., Tk) -> (..., H, Tq, Tk) float32."""
        distance = (query_positions[..., :, None] - key_positions[..., None, :]).abs()  # (..., Tq, Tk)
        slopes = self.slopes.to(distance.device)[:, None, None]  # (H, 1, 1)
        return -slopes * distance[..., None, :, :].to(torch.float32)


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position (key position - query position), an int64 tensor of any shape.

    Bidirectional: keys after the query get the upper half of the buckets, keys at or before it the lower
    half; causal: every bucket goes to keys at or before the query (later keys fall into bucket 0, unseen
    anyway). Within a half of n buckets, distances 0 .. n/2 - 1 have a bucket each; larger distances share
    logarithmically wider buckets up to max_distance, and everything beyond falls into the last one.
    """
    distance = -relative_position  # how far the key lies before the query
    offset = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        offset = (distance < 0).long() * num_buckets
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)
    exact = num_buckets // 2
    # log-spaced buckets for exact <= distance < max_distance (distance 0 never takes this branch)
    fraction = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    logarithmic = exact + (fraction * (num_buckets - exact)).long()
    logarithmic = logarithmic.clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, logarithmic)


def check_bucketing(num_buckets: object, max_distance: object) -> None:
    """One-line errors for T5 bucket settings that leave no exact bucket or no logarithmic range."""
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 4:
        raise ValueError(f"attention.num_buckets must be an int >= 4 (T5: 32), got {num_buckets!r}")
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance <= num_buckets // 2:
        raise ValueError(
            f"attention.max_distance must be an int > num_buckets // 2 = {num_buckets // 2} (T5: 128), "
            f"got {max_distance!r}"
        )


class T5RelativeBias(nn.Module):
    """T5's learned relative position bias: one scalar per head and distance bucket (Raffel et al. 2020)."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        check_bucketing(num_buckets, max_distance)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Positions (..., Tq), (..., Tk) -> (..., H, Tq, Tk) in the embedding's dtype."""
        relative = key_positions[..., None, :] - query_positions[..., :, None]  # (..., Tq, Tk)
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).movedim(-1, -3)


def constant_beyond(bias: nn.Module, length: int) -> int:
    """M: the bias takes one value (one parameter) for all j - i <= -M and one for all j - i >= M; at most length."""
    if not isinstance(bias, T5RelativeBias):
        return length  # ALiBi: every distance differs
    distance = torch.arange(bias.max_distance + 2)
    reach = 0
    for sign in (-1, 1):
        buckets = relative_position_bucket(sign * distance, bias.bidirectional, bias.num_buckets, bias.max_distance)
        differs = (buckets != buckets[-1]).nonzero()
        reach = max(reach, int(differs.max()) + 1 if len(differs) else 0)
    return max(1, min(reach, length))


def distance_table(bias: nn.Module, reach: int, device: torch.device) -> torch.Tensor:
    """(H, 2 * reach + 1): entry c is the bias at distance j - i = c - reach, the ends standing for every distance
    beyond them; evaluated by the bias module itself at those positions (so autograd reaches T5's table)."""
    near = bias(torch.tensor([reach - 1], device=device), torch.arange(2 * reach - 1, device=device))[:, 0]
    left = bias(torch.tensor([reach], device=device), torch.tensor([0], device=device))[:, 0]
    right = bias(torch.tensor([0], device=device), torch.tensor([reach], device=device))[:, 0]
    return torch.cat([left, near, right], dim=-1)


def build_position_bias(
    name: str, num_heads: int, *, causal: bool, num_buckets: int = 32, max_distance: int = 128
) -> nn.Module:
    """The bias called `name` for `num_heads` heads; T5 buckets causally for causal attention."""
    check_choice("attention.position_bias", name, POSITION_BIASES)
    if name == "alibi":
        return ALiBi(num_heads)
    return T5RelativeBias(num_heads, num_buckets, max_distance, bidirectional=not causal)
