"""The decoder family's block options (norm, gated MLP, per-projection biases, qk_norm, untied head): equal to
transformers' Llama modules, combinable with every attention variant, one-line errors for bad values."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_gpt import VARIANTS, tiny_gpt
from zoo.models.gpt import GPT, GPTConfig
from zoo.nn.blocks import GatedMLP, build_norm, mlp_hidden_dim

LLAMA = dict(norm="rmsnorm", mlp="swiglu", bias=False, tie_weights=False)


def test_gated_mlp_and_rmsnorm_equal_transformers_llama_modules() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=40,
        hidden_act="silu",
        rms_norm_eps=1e-6,
    )
    theirs, ours = LlamaMLP(config).double(), GatedMLP(16, 40, "silu").double()
    ours.gate.weight.data.copy_(theirs.gate_proj.weight)
    ours.fc1.weight.data.copy_(theirs.up_proj.weight)
    ours.fc2.weight.data.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x))
    norm_theirs, norm_ours = LlamaRMSNorm(16, eps=1e-6).double(), build_norm("rmsnorm", 16, 1e-6).double()
    norm_theirs.weight.data.normal_()
    norm_ours.weight.data.copy_(norm_theirs.weight)
    torch.testing.assert_close(norm_ours(x), norm_theirs(x))


def test_gated_mlp_hidden_size_rule_and_override() -> None:
    assert mlp_hidden_dim("gelu", 32) == 128
    assert mlp_hidden_dim("swiglu", 96) == 256  # 8 * 96 / 3 = 256, a multiple of 64 already
    assert mlp_hidden_dim("geglu", 128) == 384  # 341.3 rounded up to a multiple of 64
    model = tiny_gpt(mlp="swiglu", mlp_dim=48)
    assert model.blocks[0].mlp.fc1.weight.shape == (48, 32)
    assert tiny_gpt(mlp="geglu").blocks[0].mlp.gate.weight.shape == (mlp_hidden_dim("geglu", 32), 32)


def test_llama_options_build_the_named_modules() -> None:
    model = tiny_gpt(**LLAMA, qkv_bias=True, qk_norm=True)
    block = model.blocks[0]
    assert isinstance(block.norm1, torch.nn.RMSNorm) and isinstance(model.ln_f, torch.nn.RMSNorm)
    assert block.self_attn.in_proj.bias is not None and block.self_attn.out_proj.bias is None  # Qwen2's biases
    assert block.mlp.fc1.bias is None and block.self_attn.q_norm is not None
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()  # untied head
    embeddings = model.wte.weight.numel() + model.wpe.weight.numel()
    assert model.num_parameters() == sum(p.numel() for p in model.parameters()) - embeddings


def test_qk_norm_makes_attention_independent_of_the_scale_of_queries_and_keys() -> None:
    torch.manual_seed(0)
    model = tiny_gpt(**LLAMA, qk_norm=True, norm_eps=1e-12, attention={"rope": True}).double()
    idx = torch.randint(0, 37, (2, 10))
    before = model(idx)
    with torch.no_grad():
        for block in model.blocks:
            block.self_attn.in_proj.weight[:64] *= 7.0  # the q and k rows (n_embd 32 each)
    torch.testing.assert_close(model(idx), before)
    plain = tiny_gpt(**LLAMA, norm_eps=1e-12, attention={"rope": True}).double()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "_norm" not in k})
    assert not torch.allclose(plain(idx), before, atol=1e-3)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("options", [LLAMA, dict(norm="rmsnorm", mlp="geglu", qkv_bias=True, qk_norm=True)])
def test_block_options_combine_with_every_attention_variant(name: str, options: dict) -> None:
    torch.manual_seed(0)
    model = tiny_gpt(VARIANTS[name], **options)
    idx = torch.randint(0, 37, (2, 12))
    logits = model(idx)
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 37
    torch.testing.assert_close(model(changed)[:, :8], logits[:, :8])  # causal
    caches = model.new_caches()
    steps = [model(idx[:, :5], caches)] + [model(idx[:, t : t + 1], caches) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, atol=1e-5, rtol=1e-4)
    logits.sum().backward()
    # lsh's keys are its normalised queries (shared QK): the key norm is unused by its definition
    unused = "k_norm." if VARIANTS[name].get("variant") == "lsh" else None
    assert all(
        p.grad is not None for n, p in model.named_parameters() if p.requires_grad and not (unused and unused in n)
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("norm", "batchnorm", "unknown gpt norm 'batchnorm'; valid choices: layernorm, rmsnorm"),
        ("mlp", "relu", "unknown gpt mlp 'relu'; valid choices: geglu, gelu, swiglu"),
        ("qk_norm", "yes", "gpt qk_norm must be true or false, got 'yes'"),
        ("qkv_bias", 1, "gpt qkv_bias must be true or false, got 1"),
    ],
)
def test_bad_block_options_are_one_line_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError) as error:
        GPTConfig(**{field: value})
    assert str(error.value) == message


def test_llama_config_round_trips_through_a_dict() -> None:
    model = tiny_gpt(**LLAMA, qkv_bias=True)
    again = GPT(GPTConfig.from_dict(model.config.to_dict()))
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, 37, (1, 6))
    torch.testing.assert_close(again.eval()(idx), model(idx))
