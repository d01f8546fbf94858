"""Llama, Qwen2 and Mistral checkpoints (random tiny configs saved with transformers' save_pretrained and loaded
back from the folder) give transformers' logits in zoo, the same greedy tokens, cached = uncached decoding, with
and without RoPE scaling; and export back to transformers with equal logits."""

from __future__ import annotations

import datetime
import json

import pytest
import torch

import zoo
from zoo.errors import CheckpointError, DataError
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
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0}},
            "rope_type 'yarn' needs rope_parameters.original_max_position_embeddings (the trained context length) "
            "or rope_parameters.factor",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "original_max_position_embeddings": 0}},
            "rope_parameters.original_max_position_embeddings must be a positive int",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}},
            "attention.rope_parameters.original_max_position_embeddings must be a positive int",
        ),
    ],
)
def test_unsupported_architecture_or_field_is_one_line_naming_it(change, message, tmp_path) -> None:
    """The line names the config.json it read, then the field (zoo.load and GPT.from_huggingface alike)."""
    tiny_checkpoint(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    for load in (GPT.from_huggingface, zoo.load):
        with pytest.raises(CheckpointError) as error:
            load(tmp_path)
        assert str(error.value).startswith(f"{tmp_path / 'config.json'}: {message}") and "\n" not in str(error.value)


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "intermediate_size", "num_key_value_heads"])
def test_config_json_whose_sizes_do_not_match_the_weights_names_the_tensor_and_both_shapes(
    architecture, field, tmp_path
) -> None:
    """Before: torch's multi-line size-mismatch RuntimeError from load_state_dict."""
    if architecture == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=4)).save_pretrained(
            tmp_path
        )
        field = {"hidden_size": "n_embd", "intermediate_size": "n_inner", "num_key_value_heads": "n_positions"}.get(
            field, field
        )
    else:
        tiny_checkpoint(tmp_path, architecture)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("head_dim", None)  # hidden_size / num_attention_heads, as the new hidden_size implies
    value = {"n_inner": 64}.get(field, 2 * (config.get(field) or 32))
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    for load in (GPT.from_huggingface, zoo.load) if architecture != "gpt2" else (GPT.from_huggingface,):
        with pytest.raises(CheckpointError) as error:
            load(tmp_path)
        message = str(error.value)
        assert "\n" not in message and message.startswith(f"{tmp_path / 'config.json'} does not describe the weights")
        assert "is (" in message and "in the weights, config.json implies (" in message
        assert "use the config.json saved with these weights" in message


@pytest.mark.parametrize(
    "name", ["model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.up_proj.weight"]
)
def test_a_missing_tensor_is_one_line_naming_it(name, tmp_path) -> None:
    """Before: a raw KeyError for the embedding and the final norm."""
    from safetensors.torch import load_file, save_file

    tiny_checkpoint(tmp_path, "llama")
    state = load_file(tmp_path / "model.safetensors")
    del state[name]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    for load in (GPT.from_huggingface, zoo.load):
        with pytest.raises(CheckpointError) as error:
            load(tmp_path)
        message = str(error.value)
        assert "\n" not in message and message.startswith(f"{str(tmp_path)!r}: the weights lack {name}")


def test_a_cut_off_shard_index_names_the_file(tmp_path) -> None:
    """Before: the JSON parser's message, naming no file."""
    theirs = tiny_checkpoint(tmp_path / "one", "llama")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    index.write_text(index.read_text()[:100])
    with pytest.raises(CheckpointError, match=f"^model.pretrained=.*: {index} is not valid JSON \\(cut off"):
        GPT.from_huggingface(tmp_path / "sharded")


def test_a_cut_off_shards_zoo_json_names_the_file(tmp_path) -> None:
    from zoo.data.shards import META, read_meta

    (tmp_path / META).write_text('{"kind": "images", "splits": {"tr')
    with pytest.raises(DataError, match=f"^{tmp_path / META} is not valid JSON \\(cut off"):
        read_meta(tmp_path)


def test_a_lora_checkpoint_whose_base_folder_now_holds_another_architecture_is_one_line(tmp_path) -> None:
    """Before: torch's size-mismatch RuntimeError while loading the adapters into the new base."""
    from tests.helpers import TASKS
    from zoo.nn.lora import LoRAConfig, adapter_state_dict, add_lora

    base = tmp_path / "base"
    tiny_checkpoint(base, "llama")
    tuned = add_lora(GPT.from_huggingface(base), LoRAConfig(rank=2))
    checkpoint = {
        "state_dict": {f"net.{key}": value for key, value in adapter_state_dict(tuned.state_dict()).items()},
        "hyper_parameters": {"net": tuned.config.to_dict(), "lora": {"rank": 2}, "pretrained": str(base)},
        "zoo": {"task": TASKS["gpt"], "family": "gpt"},
    }
    torch.save(checkpoint, tmp_path / "last.ckpt")
    assert isinstance(zoo.load(tmp_path / "last.ckpt"), GPT)  # the base as trained: loads
    for path in base.iterdir():
        path.unlink()
    tiny_checkpoint(base, "llama", hidden_size=64, head_dim=16)  # the folder now holds a wider model
    with pytest.raises(CheckpointError) as error:
        zoo.load(tmp_path / "last.ckpt")
    assert str(error.value) == (
        f"{str(tmp_path / 'last.ckpt')!r} holds LoRA adapters of the base {str(base)!r}, which now holds another "
        "architecture (n_embd=64 there, 32 when the adapters were trained); put the base they were trained on back "
        "in that folder"
    )
