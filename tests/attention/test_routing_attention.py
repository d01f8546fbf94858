"""Routing attention (Roy et al. 2021): given the k-means assignments, exactly softmax attention under the mask the
definition gives (built here with loops: the local heads' band; the routing heads' same cluster, own or previous
chunk of the cluster's run; causal), in outputs, weights and input gradients (fp32 1e-5, fp64 1e-10); the k-means
update by hand; the centroids drawn from the first training batch's keys; balanced chunks; causality; decoding
equals the forward; the centroids are a buffer that training moves and checkpoints carry (old ones too)."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.attention import HeadLayout, MultiHeadAttention, TokenLayout
from zoo.attention.biases import build_position_bias
from zoo.attention.clustered import cluster_slots
from zoo.attention.contract import AttentionCall
from zoo.attention.functional import fill_rows_
from zoo.attention.routing import RoutingAttention
from zoo.errors import ZooWarning

from .helpers import banded_mask, random_padding, reference_softmax_attention


def chunked_cluster_mask(clusters: list[int], chunk: int, causal: bool) -> torch.Tensor:
    """(n, n): i sees j iff same cluster and j's rank among its cluster's tokens, // chunk, is i's or one less."""
    length = len(clusters)
    rank = [sum(1 for t in range(i) if clusters[t] == clusters[i]) for i in range(length)]
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            same = clusters[i] == clusters[j] and rank[i] // chunk - rank[j] // chunk in (0, 1)
            allowed[i, j] = same and (j <= i or not causal)
    return allowed


def routing_kernel(
    clusters: int, chunk: int, kv_heads: int, dim: int, dtype=torch.float32, local_heads: int = 0, window: int = 5
) -> RoutingAttention:
    torch.manual_seed(0)
    kernel = RoutingAttention(clusters=clusters, chunk_size=chunk, local_heads=local_heads, window=window)
    kernel.setup(TokenLayout())
    kernel.setup_heads(HeadLayout(num_heads=4, kv_heads=kv_heads, head_dim=dim))
    return kernel.to(dtype).eval()


def expected_mask(kernel: RoutingAttention, k: torch.Tensor, causal: bool, heads: int) -> torch.Tensor:
    """(B, H, n, n): the band of `window` for the first local_heads heads, the others' from the kernel's assignments
    (nearest centroid by cosine, checked here against its definition)."""
    unit = k / k.norm(dim=-1, keepdim=True)
    cosine = torch.einsum("bgnd,gcd->bgnc", unit, kernel.centroids)
    assignments = kernel.assign(k)
    torch.testing.assert_close(assignments, cosine.argmax(dim=-1))
    groups = heads // k.shape[1]
    length = k.shape[2]
    band = banded_mask(length, kernel.window, causal)
    masks = [
        [
            band
            if h < kernel.local_heads
            else chunked_cluster_mask(assignments[b, h // groups].tolist(), kernel.chunk, causal)
            for h in range(heads)
        ]
        for b in range(k.shape[0])
    ]
    return torch.stack([torch.stack(row) for row in masks])


def reference_weights(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, bias=None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) under `allowed`, rows with no key zero (key/value heads repeated)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + (0.0 if bias is None else bias)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("chunk", [4, 64])  # 64: longer than every cluster (the kernel shrinks it)
@pytest.mark.parametrize("local_heads", [0, 1, 2, 4])  # 1: a key/value head shared by a local and a routing head
def test_routing_matches_softmax_under_the_assignment_mask(
    dtype, tolerance, causal, padded, biased, chunk, local_heads
) -> None:
    kernel = routing_kernel(clusters=3, chunk=chunk, kv_heads=2, dim=8, dtype=dtype, local_heads=local_heads)
    generator = torch.Generator().manual_seed(3)
    length = 29
    q = torch.randn(2, 4, length, 8, generator=generator, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 2, length, 8, generator=generator, dtype=dtype, requires_grad=True) for _ in "kv")
    padding = random_padding(2, length, generator, left=causal) if padded else None
    bias = build_position_bias("alibi", 4, causal=causal).to(dtype) if biased else None
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias)
    mask = expected_mask(kernel, k.detach(), causal, heads=4)
    if padding is not None:
        mask = mask & ~padding[:, None, None, :]
    positions = torch.arange(length)
    scores_bias = bias(positions, positions) if biased else None
    expected = reference_softmax_attention(q, k, v, mask, scores_bias)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    grad = torch.randn(out.shape, generator=generator, dtype=dtype)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    with_weights, weights = kernel(q, k, v, causal=causal, key_padding_mask=padding, bias=bias, need_weights=True)
    torch.testing.assert_close(with_weights, expected, atol=tolerance, rtol=tolerance)
    want = reference_weights(q.detach(), k.detach(), mask, scores_bias)
    torch.testing.assert_close(weights, want, atol=tolerance, rtol=tolerance)


def test_kmeans_update_by_hand() -> None:
    """Centroids e1, e2; keys (1, 0.1), (3, 0) -> cluster 0, (0, 2) -> cluster 1; decay 0.5: cluster 0 moves to
    normalise(0.5 e1 + 0.5 mean(normalise(1, 0.1), (1, 0))), cluster 1 stays e2 (its mean is e2)."""
    kernel = RoutingAttention(clusters=3, chunk_size=4, decay=0.5)
    kernel.setup(TokenLayout())
    kernel.setup_heads(HeadLayout(num_heads=1, kv_heads=1, head_dim=2))
    kernel.centroids.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]]))
    k = torch.tensor([[1.0, 0.1], [3.0, 0.0], [0.0, 2.0]])[None, None]
    clusters = kernel.assign(k)
    assert clusters.tolist() == [[[0, 0, 1]]]
    kernel.update_centroids(k, clusters, None)
    mean = (torch.tensor([1.0, 0.1]) / math.hypot(1.0, 0.1) + torch.tensor([1.0, 0.0])) / 2
    moved = 0.5 * torch.tensor([1.0, 0.0]) + 0.5 * mean
    torch.testing.assert_close(kernel.centroids[0, 0], moved / moved.norm())
    torch.testing.assert_close(kernel.centroids[0, 1], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(kernel.centroids[0, 2], torch.tensor([-1.0, 0.0]))  # no key: unchanged
    padded = torch.tensor([[False, True, False]])  # a padded key does not pull its centroid
    kernel.centroids.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]]))
    kernel.update_centroids(k, clusters, padded)
    moved = 0.5 * torch.tensor([1.0, 0.0]) + 0.5 * torch.tensor([1.0, 0.1]) / math.hypot(1.0, 0.1)
    torch.testing.assert_close(kernel.centroids[0, 0], moved / moved.norm())


def test_chunks_are_balanced_whatever_the_clusters() -> None:
    """Every slot holds at most one token, every chunk tokens of one cluster only, at most `chunk` of them,
    in position order; a very unbalanced assignment (one big cluster) costs at most one partial chunk per cluster."""
    generator = torch.Generator().manual_seed(0)
    clusters = torch.where(torch.rand(3, 100, generator=generator) < 0.8, 0, torch.randint(1, 5, (3, 100)))
    slots, total, used = cluster_slots(clusters, 5, 8)
    assert used == 8 and total <= (13 + 5) * 8
    for row in range(3):
        assert len(set(slots[row].tolist())) == 100 and int(slots[row].max()) < total
        for chunk in range(total // 8):
            tokens = [t for t in range(100) if slots[row, t] // 8 == chunk]
            assert len({int(clusters[row, t]) for t in tokens}) <= 1 and len(tokens) <= 8
            assert tokens == sorted(tokens, key=lambda t: int(slots[row, t]))


def test_a_chunk_longer_than_every_cluster_shrinks_to_the_largest_cluster() -> None:
    """Chunks of 64 over 20 tokens in 4 clusters: the chunk used is the largest cluster's size (the pattern is the
    whole own cluster either way), so the slots number at most clusters x largest cluster, not 4 x 64."""
    clusters = torch.tensor([[0] * 9 + [1] * 5 + [2] * 4 + [3] * 2, [3, 1] * 10])
    slots, total, used = cluster_slots(clusters, 4, 64)
    assert used == 10 and total == 4 * 10  # row 0: four clusters, each in one chunk of 10 slots
    assert sorted(slots[1].tolist()) == list(range(20)) and len(set(slots[0].tolist())) == 20


def test_training_moves_centroids_and_checkpoints_carry_them() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, variant="routing", causal=True, layout=TokenLayout(max_length=32))
    before = module.kernel.centroids.clone()
    module.train()(torch.randn(2, 20, 16))
    assert not torch.equal(module.kernel.centroids, before)
    moved = module.kernel.centroids.clone()
    module.eval()(torch.randn(2, 20, 16))
    assert torch.equal(module.kernel.centroids, moved)  # eval keeps them
    restored = MultiHeadAttention(16, 2, variant="routing", causal=True, layout=TokenLayout(max_length=32))
    restored.load_state_dict(module.state_dict())
    assert torch.equal(restored.kernel.centroids, moved)


def test_causal_routing_is_causal_and_decoding_equals_the_forward() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(
        32, 4, variant="routing", causal=True, kv_heads=2, rope=True, layout=TokenLayout(max_length=40)
    ).eval()
    x = torch.randn(2, 33, 32)
    whole = module(x)
    changed = x.clone()
    changed[:, 20:] = torch.randn(2, 13, 32)
    torch.testing.assert_close(module(changed)[:, :20], whole[:, :20], atol=1e-6, rtol=1e-6)
    cache = module.new_cache()
    steps = [module(x[:, :6], cache=cache)] + [module(x[:, i : i + 1], cache=cache) for i in range(6, 33)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("local_heads", [1, 2, 3])
def test_decoding_with_local_heads_equals_the_forward_with_padding_bias_and_weights(local_heads) -> None:
    """Kernel level, grouped heads (4 query heads on 2 key/value heads), left padding, ALiBi: decoding a prompt then
    one token at a time gives the forward's outputs and weights, local heads and routing heads alike."""
    kernel = routing_kernel(clusters=3, chunk=3, kv_heads=2, dim=8, dtype=torch.float64, local_heads=local_heads)
    generator = torch.Generator().manual_seed(1)
    length = 23
    q = torch.randn(2, 4, length, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, 2, length, 8, generator=generator, dtype=torch.float64) for _ in "kv")
    padding = random_padding(2, length, generator, left=True)
    bias = build_position_bias("alibi", 4, causal=True).to(torch.float64)
    out, weights = kernel(q, k, v, causal=True, key_padding_mask=padding, bias=bias, need_weights=True)
    mask = expected_mask(kernel, k, True, heads=4) & ~padding[:, None, None, :]
    positions = torch.arange(length)
    torch.testing.assert_close(weights, reference_weights(q, k, mask, bias(positions, positions)))
    cache = kernel.new_cache()
    prompt = AttentionCall(causal=True, key_padding_mask=padding[:, :5], bias=bias)
    steps = [kernel.decode(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache, prompt)]
    step_weights = []
    for i in range(5, length):
        new = (x[:, :, i : i + 1] for x in (q, k, v))
        call = AttentionCall(causal=True, key_padding_mask=padding[:, : i + 1], need_weights=True, bias=bias)
        step = kernel.decode(*new, cache, call)
        steps.append(step)
        step_weights.append(step[1][:, :, 0])
    torch.testing.assert_close(torch.cat([o for o, _ in steps], dim=2), out, atol=1e-10, rtol=1e-10)
    for i, row in enumerate(step_weights, start=5):
        torch.testing.assert_close(row, weights[:, :, i, : i + 1], atol=1e-10, rtol=1e-10)


def test_local_heads_default_to_half_and_the_window_to_two_chunks() -> None:
    """local_heads=None: the first H // 2 heads are local; window=None: 2 * chunk_size keys (the most a routing
    query sees); both as if given."""
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 30, 8, generator=generator)
    k, v = (torch.randn(1, 4, 30, 8, generator=generator) for _ in "kv")
    outputs = []
    for options in ({}, {"local_heads": 2, "window": 10}):
        torch.manual_seed(0)
        kernel = RoutingAttention(clusters=3, chunk_size=5, **options)
        kernel.setup_heads(HeadLayout(num_heads=4, kv_heads=4, head_dim=8))
        assert (kernel.num_local_heads, kernel.local_window) == (2, 10)
        outputs.append(kernel.eval()(q, k, v, causal=True)[0])
    torch.testing.assert_close(outputs[0], outputs[1], atol=0, rtol=0)


def drawn_tokens(real: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """The tokens (flat over the batch) the kernel's draw picks: `count` of the real ones, by torch's generator."""
    torch.manual_seed(seed)
    tokens = real.flatten().nonzero()[:, 0]
    return tokens[torch.randperm(len(tokens))[:count]]


def test_the_first_training_batch_sets_the_centroids_to_drawn_keys_directions() -> None:
    """centroid_init=keys: eval leaves the random start; the first training call sets each key/value head's centroids
    to the unit directions of `clusters` real keys drawn by torch's generator (no padded one), with no average step;
    the second call moves them by the average (decay 0.5) and draws nothing."""
    kernel = routing_kernel(clusters=5, chunk=4, kv_heads=2, dim=8)  # centroid_init=keys by default
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 12, 8, generator=generator)
    k, v = (torch.randn(2, 2, 12, 8, generator=generator) for _ in "kv")
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[1, 3:] = True  # row 1 has 3 real tokens: 15 real of 24
    start = kernel.centroids.clone()
    kernel.eval()(q, k, v, key_padding_mask=padding)
    assert torch.equal(kernel.centroids, start) and not kernel.centroids_initialised
    torch.manual_seed(7)
    kernel.train()(q, k, v, key_padding_mask=padding)
    tokens = drawn_tokens(~padding, 5, seed=7)
    assert all(not padding.flatten()[t] for t in tokens)
    keys = k.transpose(1, 2).reshape(24, 2, 8)[tokens].transpose(0, 1)  # (G, C, D)
    torch.testing.assert_close(kernel.centroids, keys / keys.norm(dim=-1, keepdim=True), atol=1e-7, rtol=1e-6)
    assert kernel.centroids_initialised
    drawn = kernel.centroids.clone()
    kernel.decay = 0.5
    clusters = kernel.assign(k)
    kernel.train()(q, k, v, key_padding_mask=padding)
    by_hand = routing_kernel(clusters=5, chunk=4, kv_heads=2, dim=8)
    by_hand.centroids.copy_(drawn)
    by_hand.decay = 0.5
    by_hand.update_centroids(k, clusters, padding)
    torch.testing.assert_close(kernel.centroids, by_hand.centroids, atol=0, rtol=0)


def test_random_centroid_init_keeps_the_random_start_and_averages_from_the_first_batch() -> None:
    kernel = RoutingAttention(clusters=3, chunk_size=4, local_heads=0, centroid_init="random", decay=0.5)
    kernel.setup_heads(HeadLayout(num_heads=2, kv_heads=2, head_dim=8))
    assert kernel.centroids_initialised
    k = torch.randn(1, 2, 10, 8)
    start, clusters = kernel.centroids.clone(), kernel.assign(k)
    kernel.train()(torch.randn(1, 2, 10, 8), k, torch.randn(1, 2, 10, 8))
    by_hand = RoutingAttention(clusters=3, chunk_size=4, local_heads=0, centroid_init="random", decay=0.5)
    by_hand.setup_heads(HeadLayout(num_heads=2, kv_heads=2, head_dim=8))
    by_hand.centroids.copy_(start)
    by_hand.update_centroids(k, clusters, None)
    torch.testing.assert_close(kernel.centroids, by_hand.centroids, atol=0, rtol=0)


def routing_module(**options) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(
        16, 4, variant="routing", causal=True, layout=TokenLayout(max_length=32), clusters=3, **options
    )


def test_a_loaded_checkpoint_does_not_draw_its_centroids_again() -> None:
    trained = routing_module()
    trained.train()(torch.randn(2, 20, 16))
    assert trained.kernel.centroids_initialised
    restored = routing_module()
    restored.load_state_dict(trained.state_dict())
    assert restored.kernel.centroids_initialised
    restored.kernel.decay = 1.0 - 1e-12  # an average step then leaves the centroids (almost) where they are
    restored.train()(torch.randn(2, 20, 16) * 10)
    torch.testing.assert_close(restored.kernel.centroids, trained.kernel.centroids, atol=1e-6, rtol=0)


@pytest.mark.parametrize("local_heads", [0, 2])
def test_a_checkpoint_from_before_local_heads_loads_and_keeps_its_centroids(local_heads) -> None:
    """A state dict without `centroids_initialised` (written before it existed) loads strictly: its centroids are
    kept, counted as initialised (training averages, never draws), and a kernel with local heads says in a
    ZooWarning that the checkpoint's heads all routed."""
    old = routing_module(local_heads=0)
    old.train()(torch.randn(2, 20, 16))
    state = {key: value for key, value in old.state_dict().items() if not key.endswith("centroids_initialised")}
    assert any(key.endswith("centroids") for key in state)
    restored = routing_module(local_heads=local_heads)
    if local_heads:
        with pytest.warns(ZooWarning, match="predates local heads.*attention.local_heads=0"):
            restored.load_state_dict(state)
    else:
        restored.load_state_dict(state)
    assert torch.equal(restored.kernel.centroids, old.kernel.centroids) and restored.kernel.centroids_initialised


def test_options_are_checked_in_one_line() -> None:
    from zoo.attention.config import AttentionConfig

    with pytest.raises(ValueError, match="decay.*in \\(0, 1\\), got 1.5"):
        AttentionConfig(variant="routing", decay=1.5)
    with pytest.raises(ValueError, match="clusters.*positive int"):
        AttentionConfig(variant="routing", clusters=0)
    with pytest.raises(ValueError, match="max length.*attention.clusters and attention.chunk_size"):
        RoutingAttention().setup(TokenLayout())
    with pytest.raises(ValueError, match="local_heads.*int >= 0, got -1"):
        AttentionConfig(variant="routing", local_heads=-1)
    with pytest.raises(ValueError, match="window.*positive int or null, got 0"):
        AttentionConfig(variant="routing", window=0)
    with pytest.raises(ValueError, match="centroid_init 'kmeans'; valid choices: keys, random"):
        AttentionConfig(variant="routing", centroid_init="kmeans")
    with pytest.raises(ValueError, match="local_heads=5 .* at most the 4 query heads"):
        RoutingAttention(clusters=2, chunk_size=2, local_heads=5).setup_heads(HeadLayout(4, 4, 8))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("no_self", [True, False])
@pytest.mark.parametrize("chunk", [7, 64])
def test_clustered_attention_in_inference_equals_the_masked_formula(causal, no_self, chunk) -> None:
    """Under no_grad (with the switch on: the fused kernel's path, zoo/attention/fast/clustered.py) the chunks give
    the dense formula's output and log-sum-exp, with padding and uneven clusters."""
    from zoo.attention.clustered import clustered_attention, dense_clustered_attention

    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 90, 8, generator=generator) for _ in range(3))
    clusters = torch.randint(0, 5, (2, 3, 90), generator=generator)
    padding = random_padding(2, 90, generator, left=causal)
    options = dict(causal=causal, key_padding_mask=padding, no_self=no_self)
    with torch.no_grad():
        out, lse = clustered_attention(q, k, v, clusters, 5, chunk, **options)
        expected, _, expected_lse = dense_clustered_attention(q, k, v, clusters, 5, chunk, **options)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, expected_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.fast_path
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_the_fused_own_and_previous_chunks_pass_gradcheck_and_equal_the_reference_path(causal, padded) -> None:
    """The training step's autograd.Function (fast/clustered.py `_OwnAndPrevious`: length classes, the previous
    chunk's call, the kernel's backward, the layout's gradient by copy) in fp64: its gradient is its forward's
    (gradcheck), and its output and input gradients are the reference path's (the switch off) to 1e-10."""
    from zoo.attention.clustered import chunk_layout, clustered_attention
    from zoo.attention.fast import clustered as fast_clustered
    from zoo.attention.fast import set_fast_kernels

    generator = torch.Generator().manual_seed(7)
    length, num_clusters, chunk = 36, 3, 6
    q, k, v = (torch.randn(1, 2, length, 3, generator=generator, dtype=torch.float64) for _ in "qkv")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    clusters = torch.randint(0, num_clusters, (1, 2, length), generator=generator)
    padding = random_padding(1, length, generator, left=causal) if padded else None
    options = dict(causal=causal, key_padding_mask=padding, need_lse=False)
    chunks = chunk_layout(q, k, v, clusters, num_clusters, chunk, causal=causal)
    layout = fast_clustered._Classes(chunks, causal, padded)
    assert len(layout.classes) > 1 and any(group.with_previous.numel() for group in layout.classes)

    def attention(q, k, v):
        return clustered_attention(q, k, v, clusters, num_clusters, chunk, **options)[0]

    assert fast_clustered.applies_own_and_previous((q, k, v), 0.0, False, None, False)
    assert torch.autograd.gradcheck(attention, (q, k, v), fast_mode=True)
    grad = torch.randn(q.shape, generator=generator, dtype=torch.float64)
    out = attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    set_fast_kernels(False)  # the fixture restores the switch
    expected = attention(q, k, v)
    for got, want in zip((out, *grads), (expected, *torch.autograd.grad(expected, (q, k, v), grad))):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.fast_path
def test_the_fused_chunks_in_bf16_inference_follow_the_float32_output() -> None:
    """bf16 without a gradient takes the fused chunks too (training keeps float32 and float64)."""
    from zoo.attention.clustered import clustered_attention
    from zoo.attention.fast import clustered as fast_clustered

    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 50, 16, generator=generator) for _ in "qkv")
    clusters = torch.randint(0, 4, (1, 2, 50), generator=generator)
    low = tuple(x.bfloat16() for x in (q, k, v))
    assert fast_clustered.applies_own_and_previous(low, 0.0, False, None, True)
    assert not fast_clustered.applies_own_and_previous(tuple(x.requires_grad_() for x in low), 0.0, False, None, False)
    with torch.no_grad():
        out, lse = clustered_attention(*(x.detach() for x in low), clusters, 4, 8, causal=True)
        expected, expected_lse = clustered_attention(q, k, v, clusters, 4, 8, causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(lse, expected_lse, atol=3e-2, rtol=3e-2)


@pytest.mark.no_fast_path
@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_fill_rows_writes_the_chosen_rows_and_no_other(device: str) -> None:
    """The chunk masks' empty rows (functional.fill_rows_): the CPU writes at the rows' indices, a GPU masks."""
    x = torch.arange(2 * 3 * 4, dtype=torch.float32, device=device).view(2, 3, 4)
    rows = torch.tensor([[True, False, False], [False, False, True]], device=device)
    expected = x.clone()
    expected[rows] = -1.0
    assert fill_rows_(x, rows, -1.0) is x
    torch.testing.assert_close(x, expected, atol=0, rtol=0)
