"""Hugging Face decoder checkpoints as zoo GPTs: config.json mapped field by field, weight names both ways.

LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM are the GPT family with RMSNorm, a SwiGLU MLP,
rotary positions and grouped-query heads; they differ in biases (Qwen2: on q, k, v only) and in Mistral's
sliding window (zoo's local attention: a query sees the previous `sliding_window` tokens, itself included, as
transformers' mask). GPT-2 keeps its own table in zoo/models/gpt.py. A field zoo cannot honour is one
ValueError naming it, never a silently different model. Pure dicts and tensors: no transformers import here.
"""

from __future__ import annotations

from typing import Any

import torch

from zoo.attention.positions import ROPE_PARAMETERS
from zoo.nn.blocks import mlp_hidden_dim

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}
GPT2_ARCHITECTURE = "GPT2LMHeadModel"
# transformers' defaults of the fields zoo reads, for config.json files that leave them out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "sliding_window": None},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": None},
    "mistral": {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                "sliding_window": 4096},
}  # fmt: skip
# The gated MLP each transformers `hidden_act` makes: act(gate_proj(x)) * up_proj(x).
GATED_MLPS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# zoo's rope_scaling values that transformers' rope types compute exactly (not static NTK).
HUGGINGFACE_ROPE_SCALINGS = ("linear", "dynamic", "yarn", "llama3")
# rope_parameters keys that are not the scaling's own settings.
ROPE_GENERAL = ("rope_type", "type", "rope_theta", "factor")


def architecture_of(config: dict[str, Any]) -> str:
    """gpt2 | llama | qwen2 | mistral, from config.json's `architectures` (or its model_type)."""
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
        if name == GPT2_ARCHITECTURE:
            return "gpt2"
    model_type = config.get("model_type")
    if not names and model_type in ("llama", "qwen2", "mistral", "gpt2"):
        return model_type
    valid = ", ".join([*ARCHITECTURES, GPT2_ARCHITECTURE])
    raise ValueError(f"unsupported Hugging Face architecture {(names or [model_type])[0]!r}; valid: {valid}")


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """AttentionConfig's rope fields from rope_theta + rope_scaling (transformers 4) or rope_parameters (5)."""
    parameters = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    if legacy:
        parameters = {**parameters, **legacy}
    base = parameters.pop("rope_theta", config.get("rope_theta", 10000.0))
    kind = parameters.pop("rope_type", None) or parameters.pop("type", None) or "default"
    parameters.pop("type", None)
    if kind not in ROPE_TYPES:
        raise ValueError(f"unsupported Hugging Face rope_type {kind!r}; valid: {', '.join(ROPE_TYPES)}")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"unsupported Hugging Face field partial_rotary_factor={config['partial_rotary_factor']}")
    settings: dict[str, Any] = {"rope": True, "rope_base": float(base)}
    if kind == "default":
        return settings
    factor = parameters.pop("factor", None)
    if factor is None and kind == "yarn":
        original = parameters.get("original_max_position_embeddings")
        if original is None:
            raise ValueError(
                "rope_type 'yarn' needs rope_parameters.original_max_position_embeddings (the trained context "
                "length) or rope_parameters.factor (max_position_embeddings / that length); neither is given"
            )
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise ValueError(
                f"rope_parameters.original_max_position_embeddings must be a positive int (the trained context "
                f"length), got {original!r}"
            )
        factor = config["max_position_embeddings"] / original
    if kind in ("linear", "dynamic"):
        parameters.pop("original_max_position_embeddings", None)  # transformers reads max_position_embeddings
    if kind in ("linear", "dynamic") and parameters:
        raise ValueError(f"unsupported Hugging Face rope_scaling field {sorted(parameters)[0]!r} for {kind}")
    settings.update(rope_scaling=kind, rope_factor=float(factor))
    if parameters:
        settings["rope_parameters"] = parameters
    return settings


def gpt_config_from_huggingface(config: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig fields (as a dict) of a Llama / Qwen2 / Mistral config.json."""
    arch = architecture_of(config)
    if arch == "gpt2":
        raise ValueError("GPT-2 configs are mapped by GPT.from_huggingface's own table")
    config = {**DEFAULTS[arch], **config}
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        raise ValueError(
            f"unsupported Hugging Face field head_dim={head_dim}: zoo's heads split hidden_size={hidden} into "
            f"num_attention_heads={heads} (head_dim {hidden // heads})"
        )
    act = config.get("hidden_act", "silu")
    if act not in GATED_MLPS:
        raise ValueError(f"unsupported Hugging Face hidden_act {act!r}; valid: {', '.join(GATED_MLPS)}")
    if arch == "llama" and config["attention_bias"] != config["mlp_bias"]:
        raise ValueError(
            f"unsupported Hugging Face fields attention_bias={config['attention_bias']} with "
            f"mlp_bias={config['mlp_bias']}: zoo's `bias` covers both (and q/k/v alone: qkv_bias)"
        )
    layer_types = set(config.get("layer_types") or ["full_attention"])
    if (arch == "qwen2" and config["use_sliding_window"]) or len(layer_types) > 1:
        raise ValueError(f"unsupported Hugging Face field layer_types={sorted(layer_types)}: one attention per model")
    attention: dict[str, Any] = {**rope_settings(config), "dropout": float(config.get("attention_dropout", 0.0))}
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads != heads:
        attention["kv_heads"] = kv_heads
    window = config["sliding_window"] if arch == "mistral" else None
    if window is not None:
        attention.update(variant="local", window=int(window))
    bias = bool(config.get("attention_bias", False)) if arch == "llama" else False
    return {
        "vocab_size": config["vocab_size"],
        "block_size": config["max_position_embeddings"],
        "n_layer": config["num_hidden_layers"],
        "n_head": heads,
        "n_embd": hidden,
        "mlp_dim": config["intermediate_size"],
        "dropout": 0.0,
        "bias": bias,
        "qkv_bias": True if arch == "qwen2" else None,
        "norm": "rmsnorm",
        "mlp": GATED_MLPS[act],
        "activation": "silu",
        "norm_eps": float(config["rms_norm_eps"]),
        "tie_weights": bool(config["tie_word_embeddings"]),
        "attention": attention,
    }


def llama_family_name(name: str) -> str:
    """A Llama-family tensor's name as save_pretrained writes it (`model.` before all but the LM head)."""
    return name if name.startswith(("model.", "lm_head.")) else f"model.{name}"


def huggingface_shapes(state: dict[str, torch.Tensor], config: Any) -> dict[str, tuple[int, ...]]:
    """The shape of every Llama-family tensor that a zoo GPT (its state dict and GPTConfig) implies, by name."""
    kv_dim = (config.attention.kv_heads or config.n_head) * (config.n_embd // config.n_head)
    names = state_to_huggingface(state, config.n_layer, config.n_embd, kv_dim)
    return {name: tuple(tensor.shape) for name, tensor in names.items()}


def state_from_huggingface(state: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """zoo GPT state dict of a Llama-family state dict: q, k, v stacked into in_proj (rows q, then k, then v).
    A tensor the state lacks is left out (the model's load_state_dict names it)."""
    state = {name.removeprefix("model.") if name.startswith("model.") else name: t for name, t in state.items()}
    out = {}
    for theirs, ours in (
        ("embed_tokens.weight", "wte.weight"),
        ("norm.weight", "ln_f.weight"),
        ("lm_head.weight", "lm_head.weight"),
    ):
        if theirs in state:
            out[ours] = state[theirs]
    for i in range(n_layer):
        hf, zoo = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            parts = [state.get(f"{hf}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if all(p is not None for p in parts):
                out[f"{zoo}self_attn.in_proj.{kind}"] = torch.cat(parts)
            for theirs, ours in _BLOCK_NAMES:
                if f"{hf}{theirs}.{kind}" in state:
                    out[f"{zoo}{ours}.{kind}"] = state[f"{hf}{theirs}.{kind}"]
    return out


_BLOCK_NAMES = [
    ("input_layernorm", "norm1"),
    ("post_attention_layernorm", "norm2"),
    ("self_attn.o_proj", "self_attn.out_proj"),
    ("self_attn.q_norm", "self_attn.q_norm"),
    ("self_attn.k_norm", "self_attn.k_norm"),
    ("mlp.gate_proj", "mlp.gate"),
    ("mlp.up_proj", "mlp.fc1"),
    ("mlp.down_proj", "mlp.fc2"),
]


def state_to_huggingface(state: dict[str, torch.Tensor], n_layer: int, n_embd: int, kv_dim: int) -> dict:
    """The inverse of state_from_huggingface (transformers' names with the `model.` prefix)."""
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["ln_f.weight"]}
    out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(n_layer):
        hf, zoo = f"model.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            fused = state.get(f"{zoo}self_attn.in_proj.{kind}")
            if fused is not None:
                for name, part in zip("qkv", fused.split([n_embd, kv_dim, kv_dim])):
                    out[f"{hf}self_attn.{name}_proj.{kind}"] = part
            for theirs, ours in _BLOCK_NAMES:
                if f"{zoo}{ours}.{kind}" in state:
                    out[f"{hf}{theirs}.{kind}"] = state[f"{zoo}{ours}.{kind}"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def huggingface_config(config: Any) -> tuple[str, dict[str, Any]]:
    """(architecture class name, config.json fields) of a zoo GPTConfig with RMSNorm, a gated MLP and RoPE:
    Mistral with local attention, Qwen2 with q/k/v biases only, Llama otherwise."""
    attention = config.attention
    problems = []
    if config.norm != "rmsnorm" or config.mlp not in ("swiglu", "geglu"):
        problems.append(f"norm={config.norm!r} and mlp={config.mlp!r} (rmsnorm with swiglu or geglu)")
    if not attention.rope or attention.position_bias is not None:
        problems.append("no rotary positions (attention.rope=true, no position_bias)")
    if attention.variant not in ("full", "local"):
        problems.append(f"attention.variant={attention.variant!r} (full, or local as Mistral's sliding window)")
    kernel = attention.build_kernel()
    for option in ("sink_tokens", "global_tokens"):
        if getattr(kernel, option, 0):
            problems.append(f"attention.{option}={getattr(kernel, option)} (Mistral's sliding window has none)")
    if attention.rope_scaling is not None and attention.rope_scaling not in HUGGINGFACE_ROPE_SCALINGS:
        problems.append(
            f"attention.rope_scaling={attention.rope_scaling!r} (transformers' 'dynamic' rescales with the length, "
            f"static NTK does not; valid: {', '.join(HUGGINGFACE_ROPE_SCALINGS)})"
        )
    if config.qk_norm:
        problems.append("qk_norm=true")
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    if attention.variant == "local" and (config.bias or qkv_bias):
        problems.append("biases with a sliding window (Mistral has none)")
    if config.bias and not qkv_bias:
        problems.append("bias=true with qkv_bias=false")
    if problems:
        raise ValueError(f"no Llama / Qwen2 / Mistral has {'; '.join(problems)}")
    arch = "mistral" if attention.variant == "local" else "qwen2" if qkv_bias and not config.bias else "llama"
    rope: dict[str, Any] = {"rope_type": attention.rope_scaling or "default", "rope_theta": attention.rope_base}
    if attention.rope_scaling is not None:
        # zoo's defaults written out: transformers requires some (llama3's low/high_freq_factor).
        defaults = ROPE_PARAMETERS.get(attention.rope_scaling, {})
        rope.update({key: value for key, value in defaults.items() if value is not None})
        rope.update(factor=attention.rope_factor, **(attention.rope_parameters or {}))
        if attention.rope_scaling in ("yarn", "llama3"):
            rope.setdefault("original_max_position_embeddings", config.block_size)
    fields: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.mlp_dim or mlp_hidden_dim(config.mlp, config.n_embd),
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": attention.kv_heads or config.n_head,
        "hidden_act": "silu" if config.mlp == "swiglu" else "gelu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_weights,
        "attention_dropout": attention.dropout,
        "rope_parameters": rope,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if arch == "llama":
        fields.update(attention_bias=config.bias, mlp_bias=config.bias)
    if arch == "mistral":
        fields["sliding_window"] = attention.build_kernel().window
    return {v: k for k, v in ARCHITECTURES.items()}[arch], fields
