"""GPT: equal to Hugging Face GPT-2 with copied weights, causal, GPT-2 init, cached = uncached generation."""

from __future__ import annotations

import math

import pytest
import torch

from tests.variants import kernel_cases, settings_cases
from zoo.models.gpt import GPT, GPTConfig, sample_next_token

# Every kernel that decodes, with each of its examples and with RoPE on its first; shared settings on full attention.
VARIANTS = {
    **settings_cases(decoding=True),
    **{
        f"{variant}_rope": {"variant": variant, **options, "rope": True}
        for variant, options in kernel_cases(decoding=True, first_only=True)
    },
    "alibi": {"position_bias": "alibi"},
    "t5": {"position_bias": "t5", "num_buckets": 8, "max_distance": 16},
    "gqa": {"rope": True, "kv_heads": 1},
    "rope_ntk": {"rope": True, "rope_scaling": "ntk", "rope_factor": 2.0},
}
# Every kernel that takes a position bias, with ALiBi and grouped heads and with T5's: decoding and generating
# past block_size.
BIASED = {
    **{
        f"{variant}_alibi_gqa": {"variant": variant, **options, "position_bias": "alibi", "kv_heads": 1}
        for variant, options in kernel_cases(decoding=True, position_bias=True, first_only=True)
    },
    **{
        f"{variant}_t5": {"variant": variant, **options, "position_bias": "t5", "num_buckets": 8, "max_distance": 16}
        for variant, options in kernel_cases(decoding=True, position_bias=True, first_only=True)
    },
}


def tiny_gpt(attention: dict | None = None, **overrides) -> GPT:
    config = dict(vocab_size=37, block_size=24, n_layer=2, n_head=2, n_embd=32, attention=attention or {})
    config.update(overrides)
    return GPT(GPTConfig(**config)).eval()


def random_gpt2(**overrides):
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=97, n_positions=32, n_embd=48, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)
    config.update(overrides)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    with torch.no_grad():  # non-trivial biases and norms, not the zeros/ones of a fresh init
        for name, param in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("overrides", [{}, {"n_inner": 80, "tie_word_embeddings": False}])
def test_from_huggingface_matches_gpt2_logits(overrides: dict) -> None:
    reference = random_gpt2(**overrides)
    model = GPT.from_huggingface(reference).eval()
    idx = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        expected = reference(idx).logits
        assert torch.allclose(model(idx), expected, atol=1e-4, rtol=0)
    assert model.config.activation == "gelu_tanh"
    assert (model.lm_head.weight is model.wte.weight) == reference.config.tie_word_embeddings


def test_to_huggingface_round_trip_keeps_logits() -> None:
    pytest.importorskip("transformers")
    model = tiny_gpt(activation="gelu_tanh")
    exported = model.to_huggingface().eval()
    idx = torch.randint(0, 37, (3, 24))
    with torch.no_grad():
        assert torch.allclose(exported(idx).logits, model(idx), atol=1e-5, rtol=0)
        back = GPT.from_huggingface(exported).eval()
        assert torch.allclose(back(idx), model(idx), atol=1e-6, rtol=0)


def test_to_huggingface_rejects_what_gpt2_lacks() -> None:
    with pytest.raises(ValueError, match="rope=True"):
        tiny_gpt({"variant": "full", "rope": True}).to_huggingface()
    with pytest.raises(ValueError, match="position_bias='alibi'"):
        tiny_gpt({"position_bias": "alibi"}).to_huggingface()
    with pytest.raises(ValueError, match="kv_heads=1"):
        tiny_gpt({"kv_heads": 1}).to_huggingface()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_future_tokens_do_not_change_past_logits(name: str) -> None:
    torch.manual_seed(0)
    model = tiny_gpt(VARIANTS[name])
    idx = torch.randint(0, 37, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 37, (2, 8))
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:], atol=1e-3)


@pytest.mark.parametrize("name", sorted(VARIANTS) + sorted(BIASED))
def test_incremental_decoding_matches_full_forward(name: str) -> None:
    torch.manual_seed(0)
    model = tiny_gpt({**VARIANTS, **BIASED}[name])
    idx = torch.randint(0, 37, (2, 24))
    with torch.no_grad():
        full = model(idx)
        caches = model.new_caches()
        steps = [model(idx[:, :9], caches)] + [model(idx[:, t : t + 1], caches) for t in range(9, 24)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_cached_generation_equals_uncached_also_past_block_size(name: str) -> None:
    torch.manual_seed(0)
    model = tiny_gpt(VARIANTS[name])
    prompt = torch.randint(0, 37, (2, 5))
    outputs = []
    for use_cache in (True, False):
        generator = torch.Generator().manual_seed(3)
        outputs.append(model.generate(prompt, 40, temperature=1.0, top_k=20, use_cache=use_cache, generator=generator))
    assert outputs[0].shape == (2, 45)  # 45 > block_size 24: the context slides
    assert torch.equal(outputs[0][:, :5], prompt)
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("name", ["alibi", "t5", *sorted(BIASED)])
def test_gpt_with_a_position_bias_generates_past_block_size_without_cropping(name: str) -> None:
    torch.manual_seed(0)
    model = tiny_gpt({**VARIANTS, **BIASED}[name])
    assert model.wpe is None and model.max_length is None
    prompt = torch.randint(0, 37, (1, 30))  # longer than block_size 24: allowed
    out = model.generate(prompt, 20, temperature=0.0)
    with torch.no_grad():
        logits = model(out[:, :-1])  # one forward over all 49 tokens: nothing was cropped
    assert torch.equal(logits[0, 29:].argmax(-1), out[0, 30:])


def test_rope_gpt_trained_at_64_evaluates_at_256_with_rope_scaling() -> None:
    torch.manual_seed(0)
    trained = tiny_gpt({"rope": True}, block_size=64, n_layer=1)
    idx = torch.randint(0, 37, (1, 256))
    with pytest.raises(ValueError, match="exceeds the model's block_size=64"):
        trained(idx)
    for scaling in ("linear", "ntk", "dynamic"):
        scaled = tiny_gpt({"rope": True, "rope_scaling": scaling, "rope_factor": 4.0}, block_size=64, n_layer=1)
        scaled.load_state_dict(trained.state_dict())  # scaling adds no weights
        with torch.no_grad():
            assert torch.isfinite(scaled(idx)).all()
            unchanged = torch.allclose(scaled(idx[:, :64]), trained(idx[:, :64]), atol=1e-6)
        assert unchanged == (scaling == "dynamic")  # dynamic NTK changes nothing within the trained length


def test_greedy_generation_follows_the_argmax_of_the_full_forward() -> None:
    torch.manual_seed(0)
    model = tiny_gpt()
    out = model.generate(torch.randint(0, 37, (1, 4)), 10, temperature=0.0)
    with torch.no_grad():
        logits = model(out[:, :-1])
    assert torch.equal(logits[0, 3:].argmax(-1), out[0, 4:])


def test_generate_rejects_prompt_longer_than_block_size_and_keeps_training_mode() -> None:
    model = tiny_gpt().train()
    with pytest.raises(ValueError, match="block_size=24"):
        model.generate(torch.zeros(1, 25, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 5, top_p=1.5)
    model.generate(torch.zeros(1, 3, dtype=torch.long), 2)
    assert model.training


def test_forward_rejects_sequences_longer_than_block_size() -> None:
    with pytest.raises(ValueError, match="exceeds the model's block_size=24"):
        tiny_gpt({"variant": "full", "rope": True})(torch.zeros(1, 25, dtype=torch.long))


def test_sampling_filters() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]]).repeat(500, 1)
    generator = torch.Generator().manual_seed(0)
    assert sample_next_token(logits, temperature=0.0).flatten().tolist() == [1] * 500
    assert set(sample_next_token(logits, 1.0, top_k=1, generator=generator).flatten().tolist()) == {1}
    assert set(sample_next_token(logits, 1.0, top_k=2, generator=generator).flatten().tolist()) == {1, 2}
    # p(1) ~ 0.47, p(2) ~ 0.43: nucleus 0.5 needs both, nucleus 0.4 only the first.
    assert set(sample_next_token(logits, 1.0, top_p=0.5, generator=generator).flatten().tolist()) == {1, 2}
    assert set(sample_next_token(logits, 1.0, top_p=0.4, generator=generator).flatten().tolist()) == {1}
    assert len(set(sample_next_token(logits, 1.0, generator=generator).flatten().tolist())) == 5


def test_gpt2_initialisation_scales_residual_projections() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=8, n_head=4, n_embd=256))
    residual_std = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        assert block.self_attn.out_proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
        assert block.mlp.fc2.weight.std().item() == pytest.approx(residual_std, rel=0.05)
        assert block.mlp.fc1.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert torch.all(block.mlp.fc1.bias == 0)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.lm_head.weight is model.wte.weight


def test_rope_replaces_the_position_table_and_bias_flag_removes_biases() -> None:
    model = tiny_gpt({"variant": "full", "rope": True}, bias=False)
    assert model.wpe is None
    names = [name for name, _ in model.named_parameters()]
    assert not any(name.endswith("bias") for name in names)
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())


def test_config_errors_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="n_embd must be divisible by n_head"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got None"):
        GPTConfig(vocab_size=None)
    with pytest.raises(ValueError, match="unknown attention variant"):
        GPTConfig(attention={"variant": "bigbird"})


@pytest.mark.parametrize("attention", [*sorted(settings_cases(causal=True, first_only=True)), "full_rope"])
def test_attention_weights_are_causal_probabilities_for_every_variant(attention: str) -> None:
    torch.manual_seed(0)
    settings = {**settings_cases(causal=True), **VARIANTS}[attention]
    model = GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=2, n_head=2, n_embd=16, attention=settings))
    weights = model.eval().attention_weights(torch.randint(0, 20, (2, 12)))
    assert len(weights) == 2 and all(w.shape == (2, 2, 12, 12) for w in weights)
    for w in weights:
        torch.testing.assert_close(w.sum(dim=-1), torch.ones(2, 2, 12))
        assert (w.triu(diagonal=1) == 0).all()  # no token attends to a later one
    if settings.get("window", 12) < 12:  # the last token sees itself and the window - 1 before it
        start = 12 - settings["window"]
        assert (weights[0][..., 11, :start] == 0).all() and (weights[0][..., 11, start:] > 0).all()
    with pytest.raises(ValueError, match="13 tokens exceeds the model's block_size=12"):
        model.attention_weights(torch.zeros(1, 13, dtype=torch.long))
