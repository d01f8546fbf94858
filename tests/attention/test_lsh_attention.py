"""LSH attention (Kitaev et al. 2020): given the hashes, each round is softmax attention under the mask the
definition gives (built here with loops from the sort by bucket: own or previous chunk of the bucket's run, with
chunk_keys=bucket only the bucket's keys, with chunk_keys=chunk every key of the pair, a bucket's first chunk
paired with the previous bucket's first; causal, no self unless nothing else), and the rounds combine by their
log-sum-exps, written densely here; outputs and
input gradients at 1e-5 (fp32) / 1e-10 (fp64), with and without an ALiBi bias, under both settings of the
fast-kernels switch (fast: the fused rounds, in training too). The hash of a rotated vector; fresh hashes in
training, seeded in evaluation; causality; decoding equals the forward."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.attention import MultiHeadAttention, TokenLayout
from zoo.attention.biases import build_position_bias
from zoo.attention.fast import clustered as fast_clustered
from zoo.attention.lsh import LSHAttention, lsh_buckets

from .helpers import random_padding
from .test_routing_attention import chunked_cluster_mask


@pytest.fixture(autouse=True)
def fused_rounds_at_every_chunk(monkeypatch) -> None:
    """The chunks here are short: let the fast setting take the fused rounds (zoo/attention/fast/clustered.py) at
    any chunk length, so that the tests check it as well as the reference path."""
    monkeypatch.setattr(fast_clustered, "FUSED_MIN_CHUNK", 1)


def lsh_kernel(hashes: int, buckets: int, chunk: int, chunk_keys: str = "chunk") -> LSHAttention:
    kernel = LSHAttention(hashes=hashes, buckets=buckets, chunk_size=chunk, chunk_keys=chunk_keys, seed=5)
    kernel.setup(TokenLayout())
    return kernel.eval()


def textbook_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Andoni et al. 2015 / Reformer eq. 3: h(x) = argmax([xR; -xR]), per round and head, with loops over rounds."""
    rounds = []
    for rotation in rotations:  # (H, D, b / 2)
        rotated = x @ rotation[None]  # (B, H, n, b / 2)
        rounds.append(torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1))
    return torch.stack(rounds)


def chunk_pair_mask(buckets: list[int], num_buckets: int, chunk: int, causal: bool) -> torch.Tensor:
    """(n, n) for chunk_keys=chunk: the tokens sorted by (bucket, position), each bucket's run cut into chunks of
    `chunk` from its first token; i sees every key of its chunk and of the previous one, which is the chunk before
    it in its bucket or, for a bucket's first chunk, the first chunk of bucket b - 1 (mod buckets)."""
    length = len(buckets)
    ordered = sorted(range(length), key=lambda t: (buckets[t], t))
    runs = {b: [t for t in ordered if buckets[t] == b] for b in range(num_buckets)}
    chunks = {(b, c): run[c * chunk : (c + 1) * chunk] for b, run in runs.items() for c in range(-(-len(run) // chunk))}
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for (b, c), members in chunks.items():
        previous = chunks.get((b, c - 1), []) if c else chunks.get(((b - 1) % num_buckets, 0), [])
        for i in members:
            for j in members + previous:
                allowed[i, j] = j <= i or not causal
    return allowed


def dense_multi_round_lsh(q, v, buckets, chunk, causal, padding, bias=None, chunk_keys="bucket", num_buckets=4):
    """Reformer's multi-round LSH attention written densely: per round r the mask P_r (own or previous chunk:
    the bucket's keys, or with chunk_keys=chunk every key of the pair; causal, padding, self only if nothing
    else), out_r = softmax(q k^T / sqrt(d) + P_r) v with k = q / |q|, lse_r = logsumexp of the row;
    out = sum_r exp(lse_r - logsumexp_r(lse_r)) out_r."""
    batch, heads, length, dim = q.shape
    k = q / q.norm(dim=-1, keepdim=True)
    groups = heads // v.shape[1]
    v = v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dim)
    if bias is not None:
        scores = scores + bias(torch.arange(length), torch.arange(length))
    outs, lses = [], []
    for round_buckets in buckets:
        mask = torch.zeros(batch, heads, length, length, dtype=torch.bool)
        for b in range(batch):
            for h in range(heads):
                if chunk_keys == "chunk":
                    allowed = chunk_pair_mask(round_buckets[b, h].tolist(), num_buckets, chunk, causal)
                else:
                    allowed = chunked_cluster_mask(round_buckets[b, h].tolist(), chunk, causal)
                if padding is not None:
                    allowed &= ~padding[b][None, :]
                for i in range(length):
                    others = allowed[i].clone()
                    others[i] = False
                    if others.any():
                        allowed[i, i] = False
                mask[b, h] = allowed
        masked = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(masked, dim=-1)
        probs = torch.exp(masked - lse[..., None]).nan_to_num(0.0)
        outs.append(probs @ v)
        lses.append(lse)
    lses = torch.stack(lses)
    weights = torch.exp(lses - torch.logsumexp(lses, dim=0)).nan_to_num(0.0)
    return (weights[..., None] * torch.stack(outs)).sum(dim=0)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk", [4, 32])  # 32: longer than every bucket (the kernel shrinks it)
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("chunk_keys", ["chunk", "bucket"])
def test_lsh_matches_the_dense_multi_round_formula(dtype, tolerance, causal, padded, chunk, biased, chunk_keys) -> None:
    kernel = lsh_kernel(hashes=3, buckets=4, chunk=chunk, chunk_keys=chunk_keys)
    generator = torch.Generator().manual_seed(11)
    length = 27
    q = torch.randn(2, 4, length, 8, generator=generator, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, length, 8, generator=generator, dtype=dtype)  # unused: shared QK
    v = torch.randn(2, 2, length, 8, generator=generator, dtype=dtype, requires_grad=True)
    padding = random_padding(2, length, generator, left=causal) if padded else None
    bias = build_position_bias("alibi", 4, causal=causal).to(dtype) if biased else None
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias)
    rotations = kernel.rotations(4, 8, q.device).to(dtype)
    buckets = textbook_buckets(q.detach(), rotations)
    torch.testing.assert_close(lsh_buckets(q.detach(), rotations), buckets)
    expected = dense_multi_round_lsh(q, v, buckets, chunk, causal, padding, bias, chunk_keys)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    grad = torch.randn(out.shape, generator=generator, dtype=dtype)
    for got, want in zip(torch.autograd.grad(out, (q, v), grad), torch.autograd.grad(expected, (q, v), grad)):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    dense, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias, need_weights=True)
    torch.testing.assert_close(dense, expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(weights @ v.repeat_interleave(2, dim=1), expected, atol=tolerance, rtol=tolerance)


def test_hash_of_a_rotated_vector() -> None:
    """A vector along rotation column c hashes to bucket c, its negation to c + b / 2; positive scale and adding a
    component orthogonal to every column change nothing."""
    rotations = torch.zeros(1, 1, 4, 2)
    rotations[0, 0, 0, 0] = 1.0  # column 0 along e1
    rotations[0, 0, 1, 1] = 1.0  # column 1 along e2
    x = torch.tensor([[3.0, 0.5, 0.0, 0.0], [0.2, -2.0, 0.0, 0.0], [-1.0, 0.1, 0.0, 0.0], [0.3, 1.0, 5.0, -5.0]])
    assert lsh_buckets(x[None, None], rotations).flatten().tolist() == [0, 3, 2, 1]
    assert lsh_buckets(7 * x[None, None], rotations).flatten().tolist() == [0, 3, 2, 1]


def test_fresh_hashes_in_training_fixed_by_the_seed_in_evaluation() -> None:
    kernel = lsh_kernel(hashes=2, buckets=4, chunk=4)
    assert torch.equal(kernel.rotations(2, 8, torch.device("cpu")), kernel.rotations(2, 8, torch.device("cpu")))
    kernel.train()
    assert not torch.equal(kernel.rotations(2, 8, torch.device("cpu")), kernel.rotations(2, 8, torch.device("cpu")))


@pytest.mark.parametrize("chunk_keys", ["chunk", "bucket"])
def test_a_token_attends_to_itself_only_when_nothing_else_is_visible(chunk_keys) -> None:
    kernel = lsh_kernel(hashes=1, buckets=2, chunk=64, chunk_keys=chunk_keys)
    q = torch.randn(1, 1, 10, 8)
    _, weights = kernel(q, q, torch.randn(1, 1, 10, 8), causal=True, need_weights=True)
    assert weights[0, 0, 0, 0] == 1  # the first token sees nothing else
    diagonal = weights[0, 0].diagonal()
    others = (weights[0, 0] - torch.diag(diagonal)).sum(-1)
    assert ((diagonal == 0) | (others == 0)).all() and (diagonal[1:] == 0).any()


@pytest.mark.parametrize("chunk_keys", ["chunk", "bucket"])
def test_causal_lsh_is_causal_and_decoding_equals_the_forward(chunk_keys) -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(
        32,
        4,
        variant="lsh",
        causal=True,
        kv_heads=2,
        rope=True,
        hashes=2,
        buckets=4,
        chunk_size=4,
        chunk_keys=chunk_keys,
    ).eval()
    x = torch.randn(2, 30, 32)
    whole = module(x)
    changed = x.clone()
    changed[:, 17:] = torch.randn(2, 13, 32)
    torch.testing.assert_close(module(changed)[:, :17], whole[:, :17], atol=1e-6, rtol=1e-6)
    cache = module.new_cache()
    steps = [module(x[:, :5], cache=cache)] + [module(x[:, i : i + 1], cache=cache) for i in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_checkpoints_of_other_variants_load_into_lsh() -> None:
    full = MultiHeadAttention(32, 4, variant="full")
    lsh = MultiHeadAttention(32, 4, variant="lsh", buckets=4, chunk_size=4)
    lsh.load_state_dict(full.state_dict())  # the same parameters; the key projection is unused by lsh
    assert set(lsh.state_dict()) == set(full.state_dict())


def test_options_are_checked_in_one_line() -> None:
    from zoo.attention.config import AttentionConfig

    with pytest.raises(ValueError, match="buckets.*even.*got 3"):
        AttentionConfig(variant="lsh", buckets=3)
    with pytest.raises(ValueError, match="hashes.*positive int"):
        AttentionConfig(variant="lsh", hashes=0)
    with pytest.raises(ValueError, match="chunk_keys.*'pair'.*valid choices: bucket, chunk"):
        AttentionConfig(variant="lsh", chunk_keys="pair")


def test_bf16_training_gives_the_float32_function_within_bf16_rounding() -> None:
    """bf16 inputs with gradients (mixed-precision training, which takes the reference path under both settings):
    outputs and gradients near the float32 computation on the same inputs."""
    kernel = lsh_kernel(hashes=2, buckets=4, chunk=8)
    generator = torch.Generator().manual_seed(2)
    q0, v0 = (torch.randn(2, 4, 40, 16, generator=generator).bfloat16() for _ in "qv")
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        q, v = (x.to(dtype).requires_grad_() for x in (q0, v0))
        out, _ = kernel(q, q, v, causal=True)
        out.float().square().sum().backward()
        results.append((out.float(), q.grad.float(), v.grad.float()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=0.2, rtol=0.02)


def test_the_fused_rounds_apply_in_float32_from_their_chunk_length_where_a_gradient_is_asked(monkeypatch) -> None:
    monkeypatch.setattr(fast_clustered, "FUSED_MIN_CHUNK", 24)
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    masks = [torch.zeros(2, 3, length, 2 * length) for length in (24, 30)]
    assert fast_clustered.applies_rounds(q, masks, 0.0)
    assert not fast_clustered.applies_rounds(q, [torch.zeros(2, 3, 23, 46), *masks], 0.0)  # one round's are short
    assert not fast_clustered.applies_rounds(q.detach(), masks, 0.0)
    with torch.no_grad():
        assert not fast_clustered.applies_rounds(q, masks, 0.0)
    assert not fast_clustered.applies_rounds(q, masks, 0.1)  # dropout: the reference path
    assert not fast_clustered.applies_rounds(q.detach().bfloat16().requires_grad_(), masks, 0.0)  # float32 only
    assert not fast_clustered.applies_rounds(q, [m.requires_grad_() for m in masks], 0.0)  # a learned bias
