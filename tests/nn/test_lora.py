"""LoRA through peft on zoo's models: only the adapters train, their count is r (in + out) per adapted
projection, the merged model equals the adapted one, the base weights stay untouched, every family takes it."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model
from zoo.models.gpt import GPT, GPTConfig
from zoo.nn.lora import LoRAConfig, add_lora, merge_lora


def llama(**overrides) -> GPT:
    torch.manual_seed(0)
    config = dict(vocab_size=41, block_size=16, n_layer=2, n_head=4, n_embd=32, bias=False, norm="rmsnorm",
                  mlp="swiglu", mlp_dim=48, tie_weights=False, attention={"rope": True, "kv_heads": 2})  # fmt: skip
    return GPT(GPTConfig(**{**config, **overrides}))


def randomise_adapters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # zero at init (the adapted model starts as the base): make them count
                parameter.normal_(std=0.1)


@pytest.mark.parametrize(("targets", "per_layer"), [
    (["attention", "mlp"], 8 * ((32 + 64) + (32 + 32) + 2 * (32 + 48) + (48 + 32))),
    (["attention"], 8 * ((32 + 64) + (32 + 32))),
    (["fc2"], 8 * (48 + 32)),
])  # fmt: skip
def test_only_adapters_train_and_their_count_is_rank_times_in_plus_out(targets, per_layer) -> None:
    model = add_lora(llama(), LoRAConfig(rank=8, targets=targets))
    trainable = {name: p.numel() for name, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in name for name in trainable)
    assert sum(trainable.values()) == 2 * per_layer  # in_proj: 32 -> (4 + 2 + 2) heads x 8 = 64


def test_merged_model_equals_adapted_model_and_base_stays_untouched() -> None:
    model = llama()
    base = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    add_lora(model, LoRAConfig(rank=4, alpha=8.0, dropout=0.1))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    idx = torch.randint(0, 41, (2, 12))
    model.train()
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, tensor in model.state_dict().items():
        if "lora_" not in name:
            torch.testing.assert_close(tensor, base[name.replace(".base_layer", "")], rtol=0, atol=0)
    model.eval()
    with torch.no_grad():
        adapted = model(idx)
        assert not torch.allclose(adapted, llama()(idx), atol=1e-4)  # the adapters changed the function
        merged = merge_lora(model)
        assert set(merged.state_dict()) == set(base)  # plain parameter names again
        torch.testing.assert_close(merged(idx), adapted, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["vit", "gpt", "translation", "clip", "sequence_classifier"])
def test_every_family_takes_adapters_and_merges_them(family: str) -> None:
    model = add_lora(tiny_model(family), LoRAConfig(rank=2))
    randomise_adapters(model)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert not any("cross_attn" in name for name in trainable)  # read as a weight, so never adapted
    merged = merge_lora(tiny_model(family))  # nothing to merge: unchanged
    assert isinstance(merged, torch.nn.Module)


@pytest.mark.parametrize("family", ["vit", "gpt", "translation", "clip", "sequence_classifier"])
@pytest.mark.parametrize(("rank", "alpha"), [(3, 6.0), (4, 2.0)])
def test_each_adapted_projection_computes_its_base_plus_alpha_over_rank_b_a(family: str, rank: int, alpha: float):
    """Hu et al. 2021, eq. 3: h = W0 x + (alpha / r) B A x. Written here from the adapter's own A and B (rank > 1,
    alpha / r not 1), for every adapted projection of every family, in fp64; merging gives W0 + (alpha / r) B A."""
    model = add_lora(tiny_model(family).double(), LoRAConfig(rank=rank, alpha=alpha))
    randomise_adapters(model)
    adapted = {name: m for name, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted and {name.rsplit(".", 1)[-1] for name in adapted} >= {"in_proj", "out_proj", "fc1", "fc2"}
    expected = {}
    for name, module in adapted.items():
        base = module.get_base_layer()
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight  # (r, in), (out, r)
        assert a.shape == (rank, base.in_features) and b.shape == (base.out_features, rank)
        x = torch.randn(5, base.in_features, dtype=torch.float64)
        by_hand = x @ base.weight.T + base.bias + (alpha / rank) * (x @ a.T @ b.T)
        torch.testing.assert_close(module(x), by_hand, rtol=1e-12, atol=1e-12)
        expected[name] = base.weight + (alpha / rank) * b @ a
    merge_lora(model)
    for name, weight in expected.items():
        torch.testing.assert_close(model.get_submodule(name).weight, weight, rtol=1e-12, atol=1e-12)


def test_targets_that_match_nothing_name_the_key_and_the_projections_that_exist() -> None:
    """ViT's MLP has no gate: zoo's line, not peft's, naming model.lora.targets and what the model has."""
    with pytest.raises(ValueError) as caught:
        add_lora(tiny_model("vit"), LoRAConfig(rank=2, targets=["gate"]))
    assert str(caught.value) == (
        "model.lora.targets=['gate'] match no projection of ViT; its projections: fc1, fc2, in_proj, out_proj"
    )
    assert type(caught.value) is ValueError  # the command line's one-line kind, not peft's own error


@pytest.mark.parametrize(("options", "message"), [
    ({"rank": -1}, "model.lora.rank must be an int >= 0 (0: no LoRA), got -1"),
    ({"alpha": 0}, "model.lora.alpha must be a number > 0, got 0"),
    ({"targets": ["q_proj"]}, "unknown model.lora.targets entry 'q_proj'; valid choices: "),
])  # fmt: skip
def test_bad_lora_settings_are_one_line_errors(options, message) -> None:
    with pytest.raises(ValueError) as error:
        LoRAConfig(**options)
    assert str(error.value).startswith(message)
