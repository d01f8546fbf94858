"""Llama, Qwen2 and Mistral checkpoints (random tiny configs saved with transformers' save_pretrained and loaded
back from the folder) give transformers' logits in zoo, the same greedy tokens, cached = uncached decoding, with
and without RoPE scaling; and export back to transformers with equal logits."""

from __future__ import annotations

import datetime
import json

import pytest
import torch

from zoo.errors import CheckpointError
from zoo.models.gpt import GPT

ROPE = {
    "plain": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}  # fmt: skip
ARCHITECTURES = ("llama", "qwen2", "mistral")


def tiny_checkpoint(folder, architecture: str, rope: str = "plain", seed: int = 0, **overrides):
    """A randomly initialised transformers model of `architecture`, saved to `folder`; returns the model."""
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[architecture]
    fields = dict(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, **(ROPE[rope] or {})},
    )  # fmt: skip
    if architecture == "mistral":
        fields["sliding_window"] = 8
    if architecture == "llama":
        fields["attention_bias"] = fields["mlp_bias"] = overrides.pop("bias", False)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**fields)).eval()
    if architecture == "qwen2":  # its q/k/v biases start at zero: make them count
        with torch.no_grad():
            for layer in model.model.layers:
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    projection.bias.normal_(std=0.1)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("rope", sorted(ROPE))
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_checkpoint_folder_gives_transformers_logits_and_greedy_tokens(architecture, rope, tmp_path) -> None:
    theirs = tiny_checkpoint(tmp_path, architecture, rope)
    ours = GPT.from_huggingface(tmp_path).eval()
    assert (ours.config.attention.variant == "local") == (architecture == "mistral")
    idx = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(idx).logits
    assert (ours(idx) - expected).abs().max() < 1e-4
    prompt = idx[:1, :8]
    greedy = theirs.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)
    assert torch.equal(ours.generate(prompt, 32, temperature=0), greedy)
    assert torch.equal(ours.generate(prompt, 32, temperature=0, use_cache=False), greedy)
    caches = ours.new_caches()
    with torch.no_grad():
        steps = [ours(idx[:, :5], caches)] + [ours(idx[:, t : t + 1], caches) for t in range(5, 20)]
    assert (torch.cat(steps, dim=1) - expected).abs().max() < 1e-4


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_writes_the_architecture_back_with_equal_logits(architecture, tmp_path) -> None:
    import transformers

    tiny_checkpoint(tmp_path / "in", architecture, "yarn" if architecture == "llama" else "plain")
    ours = GPT.from_huggingface(tmp_path / "in").eval()
    ours.to_huggingface().save_pretrained(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert architecture_name(architecture) in config["architectures"]
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    idx = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (again(idx).logits - ours(idx)).abs().max() < 1e-4


def architecture_name(architecture: str) -> str:
    return {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[architecture]


def test_tied_llama_with_biases_and_sharded_safetensors(tmp_path) -> None:
    theirs = tiny_checkpoint(tmp_path / "one", "llama", tie_word_embeddings=True, bias=True)
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = GPT.from_huggingface(tmp_path / "sharded").eval()
    assert ours.config.tie_weights and ours.config.bias
    idx = torch.randint(0, 61, (1, 12))
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max() < 1e-4


def test_gpt2_folder_loads_too(tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    theirs.save_pretrained(tmp_path)
    ours = GPT.from_huggingface(tmp_path).eval()
    idx = torch.randint(0, 61, (1, 12))
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max() < 1e-4


def test_pickle_bin_loads_only_as_tensors(tmp_path) -> None:
    theirs = tiny_checkpoint(tmp_path, "llama")
    (tmp_path / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    ours = GPT.from_huggingface(tmp_path).eval()
    idx = torch.randint(0, 61, (1, 6))
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max() < 1e-4
    torch.save({"weights": theirs.state_dict(), "code": datetime.date(2020, 1, 1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused: it holds a pickled Python object"):
        GPT.from_huggingface(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["PhiForCausalLM"]}, "unsupported Hugging Face architecture 'PhiForCausalLM'; valid: "),
        ({"head_dim": 16}, "unsupported Hugging Face field head_dim=16"),
        ({"hidden_act": "relu"}, "unsupported Hugging Face hidden_act 'relu'; valid: silu, swish, gelu"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1.0}}, "unsupported Hugging Face rope_type "),
        ({"partial_rotary_factor": 0.5}, "unsupported Hugging Face field partial_rotary_factor=0.5"),
        ({"attention_bias": True}, "unsupported Hugging Face fields attention_bias=True with mlp_bias=False"),
    ],
)
def test_unsupported_architecture_or_field_is_one_line_naming_it(change, message, tmp_path) -> None:
    tiny_checkpoint(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError) as error:
        GPT.from_huggingface(tmp_path)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
