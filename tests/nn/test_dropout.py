"""zoo's dropout: F.dropout's function (zero with probability p, scale the rest by 1 / (1 - p)), with the fast
path's CPU mask drawn by NumPy from a seed of torch's generator (each test runs with the switch on and off)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.fast.dropout import cpu_keep_mask
from zoo.models.vit import ViT
from zoo.nn import Dropout
from zoo.nn.dropout import dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dropout_computes_x_times_mask_times_scale_in_x_dtype_with_that_gradient(dtype, fast_kernels):
    torch.manual_seed(0)
    x = torch.randn(8, 33, 65, dtype=dtype).requires_grad_()
    y = dropout(x, 0.25)
    kept = (y != 0).to(dtype)
    assert y.dtype == dtype
    y.backward(torch.ones_like(y))
    # x * mask * 1/(1-p), as F.dropout computes in fp32; F.dropout's bf16/fp16 kernel (the reference path) rounds
    # the scale first, one rounding from the unrounded scale of the fast path
    exact = fast_kernels or dtype in (torch.float32, torch.float64)
    tolerance = {"atol": 0, "rtol": 0 if exact else 1e-2}
    torch.testing.assert_close(y, x.detach() * kept * (1 / 0.75), **tolerance)
    torch.testing.assert_close(x.grad, kept * (1 / 0.75), **tolerance)


@pytest.mark.fast_path
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_is_p_within_binomial_noise(p):
    torch.manual_seed(1)
    n = 400_000
    dropped = 1.0 - cpu_keep_mask(n, p).mean()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.fast_path
def test_masks_are_independent_across_calls_and_positions():
    torch.manual_seed(2)
    masks = torch.stack([torch.from_numpy(cpu_keep_mask(20_000, 0.3)).float() for _ in range(50)])
    centred = masks - 0.7
    across_calls = (centred[1:] * centred[:-1]).mean() / 0.21
    across_positions = (centred[:, 1:] * centred[:, :-1]).mean() / 0.21
    per_position = masks.mean(0)  # the same position is not kept more often than another (no fixed mask)
    bound = 5 / math.sqrt(masks.numel())
    assert abs(across_calls) < bound and abs(across_positions) < bound
    assert per_position.std() < 1.5 * math.sqrt(0.21 / 50)
    assert not torch.equal(masks[0], masks[1])


def test_the_mask_follows_torch_seed():
    x = torch.ones(1000)
    torch.manual_seed(3)
    first = dropout(x, 0.5)
    torch.manual_seed(3)
    again = dropout(x, 0.5)
    other = dropout(x, 0.5)
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_eval_mode_p_zero_and_compiled_graphs_take_torch_dropout(monkeypatch):
    x = torch.randn(64)
    assert torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.manual_seed(4)
    traced = dropout(x, 0.5)
    torch.manual_seed(4)
    assert torch.equal(traced, F.dropout(x, 0.5))


def test_the_module_is_nn_dropout_in_state_and_repr_and_drops_only_in_training():
    ours, torchs = Dropout(0.2), nn.Dropout(0.2)
    assert isinstance(ours, nn.Dropout) and repr(ours) == repr(torchs) and ours.state_dict() == {}
    x = torch.ones(10_000)
    assert (ours(x) == 0).any()
    ours.eval()
    assert torch.equal(ours(x), x)


def test_models_use_it_and_train_differently_from_eval():
    torch.manual_seed(5)
    model = ViT(dropout=0.3)
    assert any(isinstance(m, Dropout) for m in model.modules())
    assert not any(type(m) is nn.Dropout for m in model.modules())
    x = torch.randn(4, 1, 8, 8)
    model.train()  # features: the head starts at zero
    assert not torch.equal(model.forward_features(x), model.forward_features(x))
    model.eval()
    assert torch.equal(model.forward_features(x), model.forward_features(x))
