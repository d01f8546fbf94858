"""Additive attention (Bahdanau et al. 2015) equals its formula written out densely: outputs, input gradients
and weights, with padding and causal masks, self- and cross-attention, grouped heads; it decodes from a cache."""

from __future__ import annotations

import pytest
import torch

from zoo.attention import AdditiveAttention, MultiHeadAttention
from zoo.attention.additive import additive_scores
from zoo.attention.fast import additive as fast_additive

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.fixture(autouse=True)
def fast_path_at_every_size(monkeypatch) -> None:
    """The tests' tiny rows take the fast path too when the switch is on (it starts at MIN_ROW_ELEMENTS)."""
    monkeypatch.setattr(fast_additive, "MIN_ROW_ELEMENTS", 0)


def reference(module: MultiHeadAttention, x, context, key_padding_mask, causal: bool):
    """e_ij = w_h^T tanh(W_h x_i + U_h c_j) per head, masked softmax over keys, values, out_proj: every index
    written out, no code of the kernel used."""
    heads, kv_heads, dim = module.num_heads, module.kv_heads, module.head_dim
    weight, bias = module.in_proj.weight, module.in_proj.bias
    w_q, w_k, w_v = weight.split([heads * dim, kv_heads * dim, kv_heads * dim])
    b_q, b_k, b_v = bias.split([heads * dim, kv_heads * dim, kv_heads * dim])
    source = x if context is None else context
    q = (x @ w_q.T + b_q).unflatten(-1, (heads, dim))  # (B, T, H, D)
    k = (source @ w_k.T + b_k).unflatten(-1, (kv_heads, dim))  # (B, S, G, D)
    v = (source @ w_v.T + b_v).unflatten(-1, (kv_heads, dim))
    w = module.kernel.score_vectors  # (H, D)
    batch, length, sources = x.shape[0], x.shape[1], source.shape[1]
    out = torch.zeros(batch, length, heads, dim, dtype=x.dtype)
    probs = torch.zeros(batch, heads, length, sources, dtype=x.dtype)
    for b in range(batch):
        for h in range(heads):
            g = h // (heads // kv_heads)
            for i in range(length):
                keys = [j for j in range(sources) if (key_padding_mask is None or not key_padding_mask[b, j])]
                keys = [j for j in keys if not causal or j <= i]
                if not keys:
                    continue
                e = torch.stack([w[h] @ torch.tanh(q[b, i, h] + k[b, j, g]) for j in keys])
                a = torch.softmax(e, dim=0)
                probs[b, h, i, keys] = a
                out[b, i, h] = sum(a[n] * v[b, j, g] for n, j in enumerate(keys))
    return module.out_proj(out.flatten(-2)), probs


CASES = [  # (causal, cross, kv_heads, chunk_size)
    (False, False, None, None),
    (True, False, None, 2),
    (True, False, 1, None),
    (False, True, None, 3),
    (False, True, 2, 1),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("causal", "cross", "kv_heads", "chunk_size"), CASES)
def test_additive_attention_equals_the_formula_with_masks(dtype, causal, cross, kv_heads, chunk_size) -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(12, 4, variant="additive", causal=causal, kv_heads=kv_heads, chunk_size=chunk_size).to(
        dtype
    )
    x = torch.randn(2, 5, 12, dtype=dtype, requires_grad=True)
    context = torch.randn(2, 7, 12, dtype=dtype, requires_grad=True) if cross else None
    keys = 7 if cross else 5
    key_padding_mask = torch.zeros(2, keys, dtype=torch.bool)
    key_padding_mask[1, -2:] = True  # the second sequence is padded
    if causal:
        key_padding_mask[0, 0] = True  # query 0 of sequence 0 then has no key: it must output zeros, not NaN
    out, weights = module(x, context, key_padding_mask=key_padding_mask, need_weights=True)
    expected, expected_weights = reference(module, x, context, key_padding_mask, causal)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(weights, expected_weights, atol=tol, rtol=tol)
    inputs = [x] if context is None else [x, context]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs + [module.kernel.score_vectors], grad)
    want = torch.autograd.grad(expected, inputs + [module.kernel.score_vectors], grad)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_additive_decoding_from_a_cache_equals_the_causal_forward() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="additive", causal=True, kv_heads=1).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 2] = True
    full = module(x, key_padding_mask=padding)
    cache = module.new_cache()
    steps = [module(x[:, :4], key_padding_mask=padding[:, :4], cache=cache)]  # a prompt, then one token a step
    steps += [module(x[:, t : t + 1], key_padding_mask=padding[:, : t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-12)
    cache.reorder(torch.tensor([1, 0]))  # beam search may reorder it
    assert cache.keys.shape[0] == 2


def test_additive_scores_change_with_the_score_vector_and_block_size_does_not() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2, variant="additive", chunk_size=1).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    blocked = module(x)
    module.kernel.chunk_size = None  # one block
    torch.testing.assert_close(module(x), blocked, atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        module.kernel.score_vectors.mul_(3.0)
    assert not torch.allclose(module(x), blocked)


def test_additive_attention_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        AdditiveAttention(chunk_size=0)


def test_a_position_bias_adds_to_the_additive_scores_and_decodes() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2, variant="additive", causal=True, position_bias="alibi").double().eval()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    out, weights = module(x, need_weights=True)
    plain = MultiHeadAttention(8, 2, variant="additive", causal=True).double().eval()
    plain.load_state_dict(module.state_dict(), strict=False)
    _, expected = reference(plain, x, None, None, causal=True)
    scores = expected.log() + module.position_bias(torch.arange(6), torch.arange(6))  # log p = e - logsumexp
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1), atol=1e-12, rtol=1e-12)
    cache = module.new_cache()
    steps = torch.cat([module(x[:, t : t + 1], cache=cache) for t in range(6)], dim=1)
    torch.testing.assert_close(steps, out, atol=1e-12, rtol=1e-12)


def test_additive_attention_declares_example_options_it_accepts() -> None:
    for options in AdditiveAttention.example_options:
        assert AdditiveAttention(**options).options().keys() >= options.keys()


@pytest.mark.fast_path
@pytest.mark.parametrize(("causal", "queries", "keys"), [(False, 6, 9), (True, 9, 9), (True, 4, 9)])
def test_the_fast_path_equals_the_reference_across_block_edges(causal, queries, keys, monkeypatch) -> None:
    """Blocks of 2 queries (fast.additive.BLOCK_ELEMENTS): scores where unmasked, and the gradients of q, k and w,
    equal the reference path's in fp64; causal with fewer queries than keys (decoding: the last positions)."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, queries, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, keys, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    kept = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries) if causal else torch.ones(queries, keys)
    kept = kept.bool()
    grad = torch.randn(2, 3, queries, keys, dtype=torch.float64) * kept  # the caller's mask zeroes the rest
    monkeypatch.setattr(fast_additive, "BLOCK_ELEMENTS", 2 * keys * 4)
    assert [block[1] - block[0] for block in fast_additive.query_blocks(queries, keys, 4, causal, None)][0] == 2
    fast = fast_additive.additive_scores(q, k, w, causal)
    reference = additive_scores(q, k, w)
    torch.testing.assert_close(fast[..., kept], reference[..., kept], atol=1e-12, rtol=1e-12)
    for first, end, end_key in fast_additive.query_blocks(queries, keys, 4, causal, None):
        assert (fast[..., first:end, end_key:] == 0).all()  # keys after the block's last query: not computed
    assert causal == bool((fast == 0).any())
    got = torch.autograd.grad(fast, (q, k, w), grad)
    want = torch.autograd.grad(reference, (q, k, w), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.fast_path
def test_the_fast_path_takes_chunk_size_as_its_query_block_and_cuts_causal_blocks_at_the_diagonal(monkeypatch) -> None:
    seen = []
    original = fast_additive.query_blocks
    monkeypatch.setattr(fast_additive, "query_blocks", lambda *args: seen.append(original(*args)) or seen[-1])
    module = MultiHeadAttention(8, 2, variant="additive", causal=True, chunk_size=3)
    module(torch.randn(1, 7, 8)).sum().backward()
    assert seen == [[(0, 3, 3), (3, 6, 6), (6, 7, 7)]]  # (first query, end query, end key)
    seen.clear()
    MultiHeadAttention(8, 2, variant="additive")(torch.randn(1, 7, 8))
    assert seen == [[(0, 7, 7)]]  # bidirectional, no chunk_size: one block of every key


@pytest.mark.fast_path
def test_rows_smaller_than_min_row_elements_take_the_reference_path(monkeypatch) -> None:
    monkeypatch.setattr(fast_additive, "MIN_ROW_ELEMENTS", 7 * 7 * 4)  # one row: 7 queries x 7 keys x head_dim 4
    calls = []
    original = fast_additive.additive_scores
    monkeypatch.setattr(fast_additive, "additive_scores", lambda *args: calls.append(args[0].shape) or original(*args))
    module = MultiHeadAttention(8, 2, variant="additive")
    module(torch.randn(1, 7, 8))
    module(torch.randn(1, 6, 8))
    assert calls == [(1, 2, 7, 4)]
