"""`model.net.checkpointing=true` is honoured in every family with Transformer blocks (conf/model/*.yaml; the RNN
has none): the task's network saves fewer tensors for the backward (only each block's input, its inside
recomputed) and its gradients equal those of the same network without it."""

from __future__ import annotations

import pytest
import torch

from tests.nn.test_checkpointing import family_inputs
from tests.tasks.test_lora import FAMILIES, build_task


def saved_bytes_and_gradients(net: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[int, dict]:
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    net.zero_grad()
    torch.manual_seed(0)  # the same dropout masks in both runs (checkpointing replays the RNG state)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = net(*inputs)
    outputs = out if isinstance(out, tuple) else (out,)
    sum(o.square().mean() for o in outputs if torch.is_tensor(o) and o.is_floating_point()).backward()
    return saved[0], {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", [family for family in FAMILIES if family != "rnn_translation"])
def test_checkpointing_from_the_config_saves_less_and_gives_the_plain_gradients(family) -> None:
    plain = build_task(family).net.double().train()
    checkpointed = build_task(family, "model.net.checkpointing=true").net.double().train()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), checkpointed.state_dict().values()))
    inputs = family_inputs("gpt" if family == "llama" else family)
    plain_bytes, plain_gradients = saved_bytes_and_gradients(plain, inputs)
    checkpointed_bytes, gradients = saved_bytes_and_gradients(checkpointed, inputs)
    assert checkpointed_bytes < plain_bytes / 2, (checkpointed_bytes, plain_bytes)  # ignored: equal
    assert gradients.keys() == plain_gradients.keys() and gradients
    for name, gradient in plain_gradients.items():
        torch.testing.assert_close(gradients[name], gradient, msg=name)
