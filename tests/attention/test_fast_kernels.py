"""The fast-kernels switch (zoo/attention/fast/) really switches: with it off no private aten op and no speed-only
autograd.Function runs, with it on each fast path runs where it applies; ZOO_FAST_KERNELS is read at import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from zoo.attention import MultiHeadAttention, fast
from zoo.attention.fast import additive, band, blocks, clustered, dropout, linear, sdpa
from zoo.nn import Dropout

# Every entry point into the fast package that a kernel file calls, and the private aten ops the package uses.
ENTRY_POINTS = [
    (additive, "additive_scores"),
    (band, "chunked_band"),
    (blocks, "fused_union"),
    (blocks, "block_windows"),
    (clustered, "own_and_previous"),
    (sdpa, "cpu_sdpa"),
    (dropout, "dropout"),
    (linear, "causal_segments"),
    (linear, "exclusive_prefix_sum"),
    (linear, "elu_plus_one"),
    (linear, "scratch"),
]
PRIVATE_OPS = ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"]


def _exercise_every_kernel() -> None:
    """Forward and backward of each kernel on inputs where its fast path applies (CPU, long enough, training)."""
    torch.manual_seed(0)
    x = torch.randn(2, 300, 32, requires_grad=True)  # past the pattern kernels' and local's dense lengths
    cases = [
        {"variant": "local", "window": 16},
        {"variant": "sparse", "stride": 64},  # band windows of whole query blocks
        {"variant": "axial", "row_length": 20},
        {"variant": "full"},
        {"variant": "full", "position_bias": "t5"},  # a learned bias: _LearnedBiasAttention
        {"variant": "routing", "clusters": 4, "chunk_size": 32},  # the chunks' training step: _OwnAndPrevious
    ]
    for options in cases:
        MultiHeadAttention(32, 4, causal=True, **options)(x).sum().backward()
    MultiHeadAttention(32, 4, causal=True)(x[:, :20]).sum().backward()  # short: the composite formula
    MultiHeadAttention(32, 4, causal=True, variant="additive")(x[:, :64]).sum().backward()  # rows of 64 x 64 x 8
    wide = torch.randn(1, 300, 128, requires_grad=True)  # heads of 32: states of 32 x 32, the prefix-sum loop's
    MultiHeadAttention(128, 4, causal=True, variant="linear", chunk_size=8)(wide).sum().backward()
    with torch.no_grad():  # the segments' scratch tensors
        MultiHeadAttention(128, 4, causal=True, variant="linear", chunk_size=8)(wide)
    Dropout(0.5).train()(torch.randn(64))


@pytest.mark.fast_path
@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
def test_the_switch_turns_every_fast_path_off_and_on(enabled: bool, monkeypatch) -> None:
    calls: dict[str, int] = {}

    def tripwire(name, original):
        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return original(*args, **kwargs)

        return wrapper

    for module, name in ENTRY_POINTS:
        monkeypatch.setattr(module, name, tripwire(name, getattr(module, name)))
    monkeypatch.setattr(linear, "SEGMENT_LENGTH", 64)  # long causal sequences: the segments run
    for op in PRIVATE_OPS:
        monkeypatch.setattr(torch.ops.aten, op, tripwire(op, getattr(torch.ops.aten, op)))
    fast.set_fast_kernels(enabled)
    _exercise_every_kernel()
    if not enabled:
        assert calls == {}, f"the reference path called the fast package: {calls}"
    else:
        expected = {name for _, name in ENTRY_POINTS} | set(PRIVATE_OPS)
        assert set(calls) == expected, f"fast paths that did not run: {expected - set(calls)}"


@pytest.mark.fast_path
def test_the_environment_variable_sets_the_default() -> None:
    code = "from zoo.attention.fast import use_fast_kernels; print(use_fast_kernels())"
    seen = {}
    for value in ("0", "1", None):
        env = {"PATH": "", "PYTHONPATH": "."} | ({} if value is None else {"ZOO_FAST_KERNELS": value})
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        seen[value] = result.stdout.strip()
    assert seen == {"0": "False", "1": "True", None: "True"}


@pytest.mark.fast_path
def test_set_fast_kernels_is_what_use_fast_kernels_reports() -> None:
    fast.set_fast_kernels(False)
    assert fast.use_fast_kernels() is False
    fast.set_fast_kernels(True)
    assert fast.use_fast_kernels() is True
