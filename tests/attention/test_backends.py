"""attention.backend: every backend a machine has gives the reference's numbers, and the choice is obeyed.

On the CPU, FlexAttention runs eagerly here (compiling it takes ~30 s per shape on these cores; eager flex
is the same API on the same block mask, evaluated without fusion) and forward only (it has no CPU backward).
The CUDA tests run the compiled flex kernel and SDPA's flash kernel; without a GPU they are skipped.
"""

from __future__ import annotations

import functools

import pytest
import torch

from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout
from zoo.attention import flex as flex_module
from zoo.attention import functional as functional_module
from zoo.attention import pattern as pattern_module
from zoo.attention import sliding_window as window_module
from zoo.attention.fast import bias as fast_bias
from zoo.attention.fast import sdpa as fast_sdpa

from .helpers import axial_mask, banded_mask, random_padding, reference_softmax_attention, sparse_mask
from .test_errors_and_config import one_line_error

PATTERNS = {  # variant -> (options, the (n, n) reference mask for n tokens, built once per shape)
    "local": ({"window": 8}, functools.cache(lambda n, causal: banded_mask(n, 8, causal))),
    "sparse": ({"stride": 8}, functools.cache(lambda n, causal: sparse_mask(n, "strided", 8, 0, causal))),
    "axial": ({"row_length": 8}, functools.cache(lambda n, causal: axial_mask(n, 8, 0, causal))),
}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention uncompiled (see the module docstring), counting its calls."""
    from torch.nn.attention.flex_attention import flex_attention

    calls = []

    def attend(*args, **kwargs):
        calls.append(args[0].shape)
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(flex_module, "compiled_flex_attention", lambda: attend)
    return calls


def kernel_reference(variant: str, backend: str, length: int, causal: bool, padded: bool, grad: bool = True):
    """A kernel with `backend`, random q, k, v (B=2, H=4, grouped as G=2), padding, and the reference output."""
    options, mask = PATTERNS[variant]
    config = AttentionConfig(variant=variant, backend=backend, **options)
    kernel = config.build_kernel()
    kernel.setup(TokenLayout(max_length=length))
    generator = torch.Generator().manual_seed(length)
    q = torch.randn(2, 4, length, 8, generator=generator, requires_grad=grad)
    k, v = (torch.randn(2, 2, length, 8, generator=generator, requires_grad=grad) for _ in range(2))
    padding = random_padding(2, length, generator, left=True) if padded else None
    allowed = mask(length, causal)[None, None]
    if padding is not None:
        allowed = allowed & ~padding[:, None, None, :]
    return kernel, (q, k, v), padding, reference_softmax_attention(q, k, v, allowed)


@pytest.mark.parametrize(("variant", "causal"), [("local", True), ("local", False), ("sparse", True), ("axial", True)])
def test_sdpa_backend_matches_the_masked_reference(variant: str, causal: bool) -> None:
    # (blockwise, the CPU's auto, is checked against the same reference in each variant's own tests.)
    kernel, (q, k, v), padding, expected = kernel_reference(variant, "sdpa", 264, causal, padded=True)
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for grad, reference in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v))):
        torch.testing.assert_close(grad, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.no_fast_path
@pytest.mark.parametrize("variant", sorted(PATTERNS))
@pytest.mark.parametrize(("causal", "padded"), [(True, False), (True, True), (False, True)])
def test_flex_backend_matches_the_masked_reference_on_cpu(variant, causal, padded, eager_flex) -> None:
    kernel, (q, k, v), padding, expected = kernel_reference(variant, "flex", 130, causal, padded, grad=False)
    out, _ = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    assert eager_flex, "backend=flex did not reach flex_attention"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if not padded:  # the block mask is kept for the next call of the same length
        assert len(kernel._flex_masks) == 1
        kernel(q, k, v, causal=causal)
        assert len(kernel._flex_masks) == 1


@pytest.mark.no_fast_path
def test_each_backend_runs_its_own_path(monkeypatch, eager_flex) -> None:
    """The option is obeyed: auto on the CPU and blockwise run the blockwise kernels, sdpa the dense mask, flex
    flex_attention (a config that ignored backend would run one path for all)."""
    ran = []

    def spy(name, module, function):
        original = getattr(module, function)

        def wrapper(*args, **kwargs):
            ran.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, function, wrapper)

    spy("blockwise", window_module, "_blockwise_sliding_window")
    spy("blockwise", pattern_module, "union_attention")
    spy("sdpa", window_module, "masked_attention")
    spy("sdpa", pattern_module, "masked_attention")
    x = torch.randn(1, 264, 32)  # past blockwise.DENSE_MAX_LENGTH: the pattern kernels' blockwise path runs
    for variant, (options, _) in PATTERNS.items():
        for backend, path in (("auto", "blockwise"), ("blockwise", "blockwise"), ("sdpa", "sdpa"), ("flex", "flex")):
            ran.clear()
            eager_flex.clear()
            module = MultiHeadAttention(32, 4, variant=variant, causal=True, backend=backend, **options)
            with torch.no_grad():
                module(x)
            assert (ran + ["flex"] * len(eager_flex)) == [path], (variant, backend, ran)


@pytest.mark.no_fast_path
def test_backend_errors_name_the_choices() -> None:
    one_line_error(lambda: AttentionConfig(backend="triton"), "backend", "'triton'", "auto, blockwise, flex, sdpa")
    one_line_error(lambda: AttentionConfig(variant="linear", backend="flex"), "'flex'", "'linear'", "auto")
    one_line_error(lambda: AttentionConfig(variant="full", backend="blockwise"), "'blockwise'", "auto, sdpa")
    one_line_error(lambda: AttentionConfig(variant="local", backend="flex", dropout=0.1), "flex", "dropout")
    one_line_error(lambda: AttentionConfig(variant="local", backend="flex", position_bias="alibi"), "flex", "alibi")
    assert AttentionConfig(variant="local", backend="flex").to_dict()["backend"] == "flex"
    module = MultiHeadAttention(32, 4, variant="local", window=8, causal=True, backend="flex")
    one_line_error(lambda: module(torch.randn(1, 40, 32)), "flex", "backward", "CPU")  # FlexAttention's limit


def test_full_attention_calls_sdpa_without_a_mask_when_is_causal_suffices(monkeypatch) -> None:
    """No boolean or float mask where is_causal does: a mask would take CUDA off the flash kernel."""
    seen = []
    original = functional_module.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return original(*args, **kwargs)

    monkeypatch.setattr(functional_module.F, "scaled_dot_product_attention", spy)
    long_enough = fast_sdpa.COMPOSITE_MAX_KEYS + 16  # shorter sequences take the composite on the CPU
    MultiHeadAttention(32, 4, causal=True)(torch.randn(2, long_enough, 32))
    assert seen == [(None, True)]


@pytest.mark.fast_path
@pytest.mark.parametrize("position_bias", ["alibi", "t5"])
def test_a_position_bias_reaches_the_cpu_kernel_as_a_table_over_distances(monkeypatch, position_bias) -> None:
    """Full attention with ALiBi or T5 on the CPU takes zoo/attention/fast/bias.py: the fused kernel with the bias
    as a view of its values per distance, never an (H, n, n) mask through SDPA or _LearnedBiasAttention; the
    outputs and gradients (T5's table among them) stay those of the formula."""
    calls = []
    relative = fast_bias._RelativeBiasAttention.apply

    def spy(*args):
        calls.append("relative")
        return relative(*args)

    def refused(*args, **kwargs):
        raise AssertionError("a dense bias mask went to SDPA")

    monkeypatch.setattr(fast_bias._RelativeBiasAttention, "apply", spy)
    monkeypatch.setattr(functional_module.F, "scaled_dot_product_attention", refused)
    monkeypatch.setattr(fast_sdpa._LearnedBiasAttention, "apply", refused)
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position_bias=position_bias)
    x = torch.randn(2, fast_sdpa.COMPOSITE_MAX_KEYS + 16, 32)
    out = module(x)
    assert calls == ["relative"]
    reference, _ = module(x, need_weights=True)  # the O(n^2) formula, not the fused kernel
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    parameters = list(module.parameters())  # T5's bias table among them
    grad = torch.randn(out.shape)
    for got, want in zip(torch.autograd.grad(out, parameters, grad), torch.autograd.grad(reference, parameters, grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.fast_path
@pytest.mark.parametrize("mask_shape", [(4, 80, 80), (2, 4, 80, 80), (2, 1, 1, 80), (80, 80)])
@pytest.mark.parametrize(("kv_heads", "dtype"), [(4, torch.float32), (2, torch.float32), (4, torch.bfloat16)])
def test_a_mask_that_takes_a_gradient_keeps_the_fused_forward_and_equals_the_formula(
    monkeypatch, mask_shape, kv_heads, dtype
) -> None:
    """A learned bias (T5's) on the CPU: SDPA's fused kernel gives no mask gradient, so sdpa runs it forward and
    recomputes the probabilities in the backward (_LearnedBiasAttention), never SDPA's math path. Outputs and
    gradients of q, k, v and the mask (per head, per batch element, per key, shared) equal the formula's."""

    def no_math_path(*args, **kwargs):
        raise AssertionError("F.scaled_dot_product_attention was called with a mask that requires grad")

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 80, 8, generator=generator).to(dtype).requires_grad_()
    k, v = (torch.randn(2, kv_heads, 80, 8, generator=generator).to(dtype).requires_grad_() for _ in range(2))
    mask = torch.randn(mask_shape, generator=generator).requires_grad_()
    monkeypatch.setattr(functional_module.F, "scaled_dot_product_attention", no_math_path)
    out = functional_module.sdpa(q, k, v, attn_mask=mask, enable_gqa=kv_heads != 4)
    monkeypatch.undo()
    assert out.dtype == dtype
    inputs = (q, k, v, mask)
    expected = reference_softmax_attention(*(t.float() for t in (q, k, v)), bias=mask)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.float(), expected, **tolerance)
    grad = torch.randn(out.shape, generator=generator)
    got = torch.autograd.grad(out, inputs, grad.to(dtype))
    want = torch.autograd.grad(expected, inputs, grad)
    for name, mine, theirs in zip(["q", "k", "v", "mask"], got, want):
        assert mine.shape == theirs.shape, name
        torch.testing.assert_close(mine.float(), theirs.float(), **tolerance, msg=lambda m, name=name: f"{name}: {m}")


@CUDA
@pytest.mark.parametrize("variant", sorted(PATTERNS))
def test_auto_runs_compiled_flex_on_cuda_and_matches_the_reference(variant: str, monkeypatch) -> None:
    calls = []
    compiled = flex_module.compiled_flex_attention()

    def attend(*args, **kwargs):
        calls.append(1)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(flex_module, "compiled_flex_attention", lambda: attend)
    kernel, inputs, padding, expected = kernel_reference(variant, "auto", 512, True, padded=True)
    q, k, v = (t.detach().cuda().requires_grad_() for t in inputs)
    out, _ = kernel.cuda()(q, k, v, causal=True, key_padding_mask=padding.cuda())
    assert calls, "auto did not choose flex on CUDA"
    torch.testing.assert_close(out.cpu(), expected.detach(), atol=2e-5, rtol=2e-5)
    out.square().sum().backward()  # flex has a backward on CUDA
    reference_grad = torch.autograd.grad(expected.square().sum(), inputs[0])[0]
    torch.testing.assert_close(q.grad.cpu(), reference_grad, atol=1e-4, rtol=1e-4)


@CUDA
def test_full_causal_attention_runs_on_the_flash_kernel_on_cuda() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    module = MultiHeadAttention(64, 4, causal=True).cuda().to(torch.bfloat16)
    x = torch.randn(2, 256, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises if the call cannot run on flash (e.g. with a mask)
        out = module(x)
    with sdpa_kernel(SDPBackend.MATH):
        reference = module(x)
    torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)
