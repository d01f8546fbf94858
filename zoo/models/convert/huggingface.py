"""Hugging Face `transformers` checkpoints as zoo models and back: config.json mapped field by field, weight
names both ways, in one place (as litgpt's convert_hf_checkpoint.py).

- Decoders: GPT2LMHeadModel, and LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM, the GPT family with
  RMSNorm, a SwiGLU MLP, rotary positions and grouped-query heads; those three differ in biases (Qwen2: on q, k, v
  only) and in Mistral's sliding window (zoo's local attention: a query sees the previous `sliding_window`
  tokens, itself included, as transformers' mask). Both ways (GPT.from_huggingface, GPT.to_huggingface).
- CLIP: transformers' CLIPModel into zoo's CLIP (CLIP.from_huggingface, CLIP.from_pretrained).

A field zoo cannot honour is one ValueError naming it, never a silently different model. Configs go in and out
as plain dicts (the models build their dataclasses) and weights as state dicts; transformers is imported only
to build an exported model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.attention.positions import ROPE_PARAMETERS
from zoo.errors import CheckpointError
from zoo.nn.blocks import mlp_hidden_dim
from zoo.weights import read_huggingface_folder, read_weights

# transformers' `activation_function` / `hidden_act` names -> zoo's; the first name of each is the one
# zoo writes when exporting.
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
}


def from_huggingface_activation(name: str) -> str:
    """A transformers activation name -> zoo's (one-line ValueError for one zoo does not have)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported Hugging Face activation {name!r}; valid choices: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def to_huggingface_activation(name: str) -> str:
    """zoo's activation name -> the transformers name (the first listed for it)."""
    for theirs, ours in ACTIVATIONS.items():
        if ours == name:
            return theirs
    valid = sorted(set(ACTIVATIONS.values()))
    raise ValueError(f"Hugging Face has no activation for zoo's {name!r}; valid choices: {valid}")


# -- decoders: reading a checkpoint -----------------------------------------------------------------------

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}
GPT2_ARCHITECTURE = "GPT2LMHeadModel"


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


@dataclass
class HuggingFaceCheckpoint:
    """A decoder's config.json (as a dict) and weights, and where they came from, for messages."""

    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    where: str  # the folder, quoted, or "the Hugging Face model"
    config_file: str  # the config.json's path, or "its config"

    @property
    def architecture(self) -> str:
        return architecture_of(self.config)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (of the first floating-point tensor)."""
        return next((t.dtype for t in self.state.values() if t.is_floating_point()), torch.float32)


def read_checkpoint(model: Any) -> HuggingFaceCheckpoint:
    """A transformers model, or a folder written by its save_pretrained (config.json and *.safetensors, read by
    zoo.weights without running code)."""
    if isinstance(model, (str, Path)):
        config, state = read_huggingface_folder(model)
        return HuggingFaceCheckpoint(config, state, repr(str(model)), str(Path(model).expanduser() / "config.json"))
    return HuggingFaceCheckpoint(model.config.to_dict(), model.state_dict(), "the Hugging Face model", "its config")


def gpt_config(config: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig fields (as a dict) of a GPT-2, Llama, Qwen2 or Mistral config.json."""
    if architecture_of(config) == "gpt2":
        return gpt2_config(config)
    return llama_family_config(config)


def gpt_state_from_huggingface(
    checkpoint: HuggingFaceCheckpoint, own: dict[str, torch.Tensor], config: Any
) -> dict[str, torch.Tensor]:
    """The zoo GPT state dict of a checkpoint, for the model `own` (its state dict) of GPTConfig `config`.

    Every tensor is checked against the shape config.json implies, and every tensor the model needs must be there
    (a tied LM head is stored once): otherwise one CheckpointError naming the file, the tensor and the fix."""
    gpt2 = checkpoint.architecture == "gpt2"
    expected = gpt2_shapes(own, config.n_layer) if gpt2 else llama_family_shapes(own, config)
    state = checkpoint.state if gpt2 else {llama_family_name(name): t for name, t in checkpoint.state.items()}
    for name, tensor in state.items():
        if name in expected and tuple(tensor.shape) != expected[name]:
            raise CheckpointError(
                f"{checkpoint.config_file} does not describe the weights: {name} is {tuple(tensor.shape)} in the "
                f"weights, config.json implies {expected[name]}; use the config.json saved with these weights"
            )
    tied = {"lm_head.weight"} if config.tie_weights else set()
    missing = [name for name in expected if name not in state and name not in tied]
    if missing:
        raise CheckpointError(
            f"{checkpoint.where}: the weights lack {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
            f"({len(missing)} of the {len(expected)} tensors config.json describes); valid: the folder as "
            "save_pretrained wrote it"
        )
    from_huggingface = gpt2_state_from_huggingface if gpt2 else llama_family_state_from_huggingface
    ours = from_huggingface(state, config.n_layer)
    missing = [name for name in own if name not in ours and name not in tied]
    unexpected = [name for name in ours if name not in own]
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint.where}: the Hugging Face weights do not fit the model its config describes: missing "
            f"{missing[:4]}, unexpected {unexpected[:4]}"
        )
    return ours


def gpt_to_huggingface(config: Any, state: dict[str, torch.Tensor]) -> Any:
    """The transformers model of a zoo GPT (its GPTConfig and state dict): GPT2LMHeadModel for a GPT-2 shaped one
    (LayerNorm, GELU MLP, full attention, learned positions); LlamaForCausalLM, Qwen2ForCausalLM or
    MistralForCausalLM for one with RMSNorm, a gated MLP and RoPE (see llama_family_huggingface_config).
    ValueError naming what neither has."""
    import transformers

    if config.norm == "layernorm" and config.mlp == "gelu":
        hf_config = transformers.GPT2Config(**gpt2_huggingface_config(config))
        architecture, hf_state = "GPT2LMHeadModel", gpt2_state_to_huggingface(state, config.n_layer)
    else:
        architecture, fields = llama_family_huggingface_config(config)
        hf_config = getattr(transformers, architecture.replace("ForCausalLM", "Config"))(**fields)
        kv_dim = (config.attention.kv_heads or config.n_head) * (config.n_embd // config.n_head)
        hf_state = llama_family_state_to_huggingface(state, config.n_layer, config.n_embd, kv_dim)
    model = getattr(transformers, architecture)(hf_config)
    missing, unexpected = model.load_state_dict(hf_state, strict=False)
    # GPT-2's causal mask buffers, in older transformers
    missing = [name for name in missing if not name.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"{architecture} export left weights unmatched: missing {missing}, unexpected {unexpected}")
    return model


# -- decoders: GPT-2 --------------------------------------------------------------------------------------
# transformers' GPT2Config defaults of the fields read below, for config.json files that leave them out.
GPT2_DEFAULTS = {"n_positions": 1024, "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1,
                 "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                 "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}  # fmt: skip


def gpt2_config(config: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig fields of a GPT-2 config.json."""
    hf = {**GPT2_DEFAULTS, **config}
    if hf["scale_attn_by_inverse_layer_idx"] or not hf["scale_attn_weights"]:
        raise ValueError(
            "only GPT-2 attention scaled by 1/sqrt(head_dim) is supported (scale_attn_weights=True, "
            "scale_attn_by_inverse_layer_idx=False)"
        )
    return dict(
        vocab_size=hf["vocab_size"],
        block_size=hf["n_positions"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        mlp_dim=hf["n_inner"] or 4 * hf["n_embd"],
        dropout=hf["resid_pdrop"],
        bias=True,
        activation=from_huggingface_activation(hf["activation_function"]),
        norm_eps=hf["layer_norm_epsilon"],
        tie_weights=bool(hf["tie_word_embeddings"]),
        attention={"dropout": hf["attn_pdrop"]},
    )


def gpt2_huggingface_config(config: Any) -> dict[str, Any]:
    """GPT2Config fields of a zoo GPTConfig; ValueError naming every option GPT-2 does not have."""
    attention = config.attention
    differences = {
        "attention.variant": attention.variant if attention.variant != "full" else None,
        "attention.rope": attention.rope or None,
        "attention.position_bias": attention.position_bias,
        "attention.kv_heads": attention.kv_heads,
        "bias": False if not config.bias else None,
        "qkv_bias": config.qkv_bias if config.qkv_bias not in (None, config.bias) else None,
        "qk_norm": config.qk_norm or None,
    }
    differences = {name: value for name, value in differences.items() if value is not None}
    if differences:
        raise ValueError(
            "GPT-2 has full multi-head attention, learned positions, biases everywhere and no qk_norm; this "
            f"model has {', '.join(f'{name}={value!r}' for name, value in differences.items())}"
        )
    return dict(
        vocab_size=config.vocab_size,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_inner=config.mlp_dim,
        layer_norm_epsilon=config.norm_eps,
        activation_function=to_huggingface_activation(config.activation),
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.attention.dropout,
        tie_word_embeddings=config.tie_weights,
        bos_token_id=None,
        eos_token_id=None,
    )


def gpt2_names(n_layer: int) -> list[tuple[str, str, bool]]:
    """(GPT-2 name, zoo name, transpose) for every weight; c_attn's columns are q, k, v as in in_proj's rows.
    GPT-2 keeps Conv1D weights as (in, out); nn.Linear wants (out, in), hence the transposes."""
    names = [
        ("transformer.wte.weight", "wte.weight", False),
        ("transformer.wpe.weight", "wpe.weight", False),
        ("transformer.ln_f.weight", "ln_f.weight", False),
        ("transformer.ln_f.bias", "ln_f.bias", False),
        ("lm_head.weight", "lm_head.weight", False),
    ]
    per_block = [
        ("ln_1", "norm1", False),
        ("attn.c_attn", "self_attn.in_proj", True),
        ("attn.c_proj", "self_attn.out_proj", True),
        ("ln_2", "norm2", False),
        ("mlp.c_fc", "mlp.fc1", True),
        ("mlp.c_proj", "mlp.fc2", True),
    ]
    for i in range(n_layer):
        for hf, zoo, transpose in per_block:
            names.append((f"transformer.h.{i}.{hf}.weight", f"blocks.{i}.{zoo}.weight", transpose))
            names.append((f"transformer.h.{i}.{hf}.bias", f"blocks.{i}.{zoo}.bias", False))
    return names


def gpt2_shapes(own: dict[str, torch.Tensor], n_layer: int) -> dict[str, tuple[int, ...]]:
    """The shape of every GPT-2 tensor that a zoo GPT (its state dict) implies, by its transformers name."""
    shapes = {}
    for hf_name, zoo_name, transpose in gpt2_names(n_layer):
        shape = tuple(own[zoo_name].shape)
        shapes[hf_name] = shape[::-1] if transpose else shape
    return shapes


def gpt2_state_from_huggingface(source: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """zoo state dict of a GPT-2 state dict."""
    state = {}
    for hf_name, zoo_name, transpose in gpt2_names(n_layer):
        if hf_name in source:  # lm_head.weight: absent when tied and stored once
            tensor = source[hf_name]
            state[zoo_name] = tensor.t() if transpose else tensor
    return state


def gpt2_state_to_huggingface(source: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """The inverse of gpt2_state_from_huggingface."""
    state = {}
    for hf_name, zoo_name, transpose in gpt2_names(n_layer):
        tensor = source[zoo_name]
        state[hf_name] = tensor.t().contiguous() if transpose else tensor
    return state


# -- decoders: Llama, Qwen2, Mistral ----------------------------------------------------------------------
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


def llama_family_config(config: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig fields (as a dict) of a Llama / Qwen2 / Mistral config.json."""
    arch = architecture_of(config)
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


def llama_family_shapes(state: dict[str, torch.Tensor], config: Any) -> dict[str, tuple[int, ...]]:
    """The shape of every Llama-family tensor that a zoo GPT (its state dict and GPTConfig) implies, by name."""
    kv_dim = (config.attention.kv_heads or config.n_head) * (config.n_embd // config.n_head)
    names = llama_family_state_to_huggingface(state, config.n_layer, config.n_embd, kv_dim)
    return {name: tuple(tensor.shape) for name, tensor in names.items()}


def llama_family_state_from_huggingface(state: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
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
            for theirs, ours in LLAMA_FAMILY_BLOCK_NAMES:
                if f"{hf}{theirs}.{kind}" in state:
                    out[f"{zoo}{ours}.{kind}"] = state[f"{hf}{theirs}.{kind}"]
    return out


LLAMA_FAMILY_BLOCK_NAMES = [
    ("input_layernorm", "norm1"),
    ("post_attention_layernorm", "norm2"),
    ("self_attn.o_proj", "self_attn.out_proj"),
    ("self_attn.q_norm", "self_attn.q_norm"),
    ("self_attn.k_norm", "self_attn.k_norm"),
    ("mlp.gate_proj", "mlp.gate"),
    ("mlp.up_proj", "mlp.fc1"),
    ("mlp.down_proj", "mlp.fc2"),
]


def llama_family_state_to_huggingface(state: dict[str, torch.Tensor], n_layer: int, n_embd: int, kv_dim: int) -> dict:
    """The inverse of llama_family_state_from_huggingface (transformers' names with the `model.` prefix)."""
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["ln_f.weight"]}
    out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(n_layer):
        hf, zoo = f"model.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            fused = state.get(f"{zoo}self_attn.in_proj.{kind}")
            if fused is not None:
                for name, part in zip("qkv", fused.split([n_embd, kv_dim, kv_dim])):
                    out[f"{hf}self_attn.{name}_proj.{kind}"] = part
            for theirs, ours in LLAMA_FAMILY_BLOCK_NAMES:
                if f"{zoo}{ours}.{kind}" in state:
                    out[f"{hf}{theirs}.{kind}"] = state[f"{zoo}{ours}.{kind}"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def llama_family_huggingface_config(config: Any) -> tuple[str, dict[str, Any]]:
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


# -- CLIP -------------------------------------------------------------------------------------------------
# transformers' CLIP is the same network: pre-norm blocks, quick_gelu, ln_pre ("pre_layrnorm") in the
# image tower, the class token through post_layernorm, the end-of-text state through final_layer_norm, and
# projections without bias. Only the names differ, and q/k/v are three matrices instead of one.
CLIP_BLOCK_NAMES = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "self_attn.out_proj": "self_attn.out_proj",
}
CLIP_NAMES = {
    "image_encoder.cls_token": "vision_model.embeddings.class_embedding",
    "image_encoder.patch_embed.weight": "vision_model.embeddings.patch_embedding.weight",
    "image_encoder.pos_embed": "vision_model.embeddings.position_embedding.weight",
    "image_encoder.norm_pre": "vision_model.pre_layrnorm",
    "image_encoder.norm": "vision_model.post_layernorm",
    "image_encoder.blocks": "vision_model.encoder.layers",
    "text_encoder.token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "text_encoder.pos_embed.weight": "text_model.embeddings.position_embedding.weight",
    "text_encoder.norm": "text_model.final_layer_norm",
    "text_encoder.blocks": "text_model.encoder.layers",
    "image_projection.weight": "visual_projection.weight",
    "text_projection.weight": "text_projection.weight",
    "logit_scale": "logit_scale",
}


def _get(config: Any, key: str) -> Any:
    return config[key] if isinstance(config, dict) else getattr(config, key)


def clip_config(hf_config: Any, attention: Any = None) -> dict[str, Any]:
    """CLIPConfig fields (as a dict, the towers as dicts) of a `transformers` CLIPConfig (object or its to_dict());
    `attention` (an AttentionConfig, its dict, or None) becomes the attention of both towers."""
    vision, text = _get(hf_config, "vision_config"), _get(hf_config, "text_config")
    eos = _get(text, "eos_token_id")
    image = dict(
        image_size=_get(vision, "image_size"),
        patch_size=_get(vision, "patch_size"),
        in_channels=_get(vision, "num_channels"),
        num_classes=0,
        dim=_get(vision, "hidden_size"),
        depth=_get(vision, "num_hidden_layers"),
        num_heads=_get(vision, "num_attention_heads"),
        mlp_dim=_get(vision, "intermediate_size"),
        pool="cls",
        activation=from_huggingface_activation(_get(vision, "hidden_act")),
        norm_eps=_get(vision, "layer_norm_eps"),
        pre_norm=True,
    )
    text_tower = dict(
        vocab_size=_get(text, "vocab_size"),
        max_length=_get(text, "max_position_embeddings"),
        dim=_get(text, "hidden_size"),
        depth=_get(text, "num_hidden_layers"),
        num_heads=_get(text, "num_attention_heads"),
        mlp_dim=_get(text, "intermediate_size"),
        activation=from_huggingface_activation(_get(text, "hidden_act")),
        norm_eps=_get(text, "layer_norm_eps"),
        # transformers keeps OpenAI's argmax rule for configs from before its eos_token_id fix (id 2).
        pool="argmax" if eos == 2 else "eot",
        eot_token_id=eos,
    )
    return dict(
        embed_dim=_get(hf_config, "projection_dim"),
        image=image,
        text=text_tower,
        attention=attention,
        logit_scale_init=_get(hf_config, "logit_scale_init_value"),
    )


def clip_sources(zoo_key: str) -> tuple[str, ...]:
    """The transformers CLIPModel parameter(s) behind one zoo CLIP parameter (q, k, v for in_proj)."""
    for prefix in ("image_encoder.blocks.", "text_encoder.blocks."):
        if zoo_key.startswith(prefix):
            index, rest = zoo_key[len(prefix) :].split(".", 1)
            layer = f"{CLIP_NAMES[prefix[:-1]]}.{index}"
            module, param = rest.rsplit(".", 1)
            if module == "self_attn.in_proj":
                return tuple(f"{layer}.self_attn.{name}_proj.{param}" for name in ("q", "k", "v"))
            if module not in CLIP_BLOCK_NAMES:
                break
            return (f"{layer}.{CLIP_BLOCK_NAMES[module]}.{param}",)
    if zoo_key in CLIP_NAMES:
        return (CLIP_NAMES[zoo_key],)
    module, _, param = zoo_key.rpartition(".")
    if module in CLIP_NAMES:
        return (f"{CLIP_NAMES[module]}.{param}",)
    raise KeyError(f"no Hugging Face counterpart for CLIP parameter {zoo_key!r}")


def clip_state_from_huggingface(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict:
    """The zoo CLIP state dict of a transformers CLIPModel state dict, for the model `own` (its state dict). Position
    tables that RoPE replaces (absent from `own`) are dropped; anything else that does not fit is one ValueError
    naming the missing and unexpected keys."""
    converted, used, missing, wrong_shapes = {}, set(), [], []
    for key, target in own.items():
        sources = clip_sources(key)
        absent = [source for source in sources if source not in state]
        if absent:
            missing += absent
            continue
        value = torch.cat([state[source] for source in sources]) if len(sources) > 1 else state[sources[0]]
        if value.numel() != target.numel():
            wrong_shapes.append(f"{sources[0]} {tuple(value.shape)} vs {tuple(target.shape)}")
            continue
        converted[key] = value.reshape(target.shape)  # class token (D,) -> (1, 1, D), position table -> (1, N, D)
        used.update(sources)
    ignorable = {key for key in state if key.endswith("position_ids")}  # transformers' index buffers
    for table in ("image_encoder.pos_embed", "text_encoder.pos_embed.weight"):
        if table not in own:  # RoPE replaces the learned position tables
            ignorable.add(CLIP_NAMES[table])
    unexpected = sorted(set(state) - used - ignorable)
    if missing or unexpected or wrong_shapes:
        raise ValueError(
            "weights do not fit this CLIP: "
            + "; ".join(
                f"{label} ({len(keys)}) {sorted(keys)[:6]}{' ...' if len(keys) > 6 else ''}"
                for label, keys in (
                    ("missing keys", missing),
                    ("unexpected keys", unexpected),
                    ("wrong shapes", wrong_shapes),
                )
                if keys
            )
        )
    return converted


def read_clip(path: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """(transformers CLIPConfig, state dict) of a CLIPModel saved to disk: a folder written by `save_pretrained`
    (config.json with model.safetensors or pytorch_model.bin, possibly sharded), or a state-dict file
    (`torch.save(model.state_dict())`, .safetensors too) with config.json beside it. Tensors are read without
    executing code (safetensors, or torch.load with weights_only=True)."""
    config_file, weight_files = _locate_clip(Path(path))
    try:
        from transformers import CLIPConfig as HuggingFaceCLIPConfig
    except ImportError:
        raise ImportError("reading a Hugging Face CLIP config needs `pip install transformers`") from None
    # transformers fills in the defaults that save_pretrained leaves out of config.json.
    config = HuggingFaceCLIPConfig.from_json_file(str(config_file))
    state: dict[str, torch.Tensor] = {}
    for file in weight_files:
        state.update(read_weights(file, "model.pretrained"))
    return config, state


def _locate_clip(path: Path) -> tuple[Path, list[Path]]:
    """(config.json, weight files) for a save_pretrained folder or a state-dict file beside config.json."""
    if path.is_dir():
        folder = path
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / index_name).is_file():  # a sharded checkpoint
                shards = sorted(set(json.loads((folder / index_name).read_text())["weight_map"].values()))
                weights = [folder / shard for shard in shards]
                break
        else:
            weights = [
                folder / name for name in ("model.safetensors", "pytorch_model.bin") if (folder / name).is_file()
            ][:1]
        if not weights:
            raise FileNotFoundError(f"model.pretrained={str(path)!r} holds no model.safetensors or pytorch_model.bin")
    elif path.is_file():
        folder, weights = path.parent, [path]
    else:
        raise FileNotFoundError(f"model.pretrained={str(path)!r} does not exist")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"model.pretrained={str(path)!r} needs the model's config.json beside it "
            "(transformers' save_pretrained writes it)"
        )
    return config_file, weights
