"""Hugging Face BERT and RoBERTa masked-LM checkpoints as zoo BERTs: config.json mapped field by field, weight names
both ways.

BertForMaskedLM and RobertaForMaskedLM are zoo's BERT (zoo/models/bert.py) with full attention and learned absolute
positions; RoBERTa differs in its position ids (position_ids=roberta), its one token type and the names of its MLM
head. A field zoo cannot honour (relative position embeddings, a decoder, cross-attention, an untied head) is one
ValueError naming it and the values that work, never a silently different model. Pure dicts and tensors: no
transformers import here.
"""

from __future__ import annotations

from typing import Any

import torch

from zoo.models.convert.huggingface import from_huggingface_activation, to_huggingface_activation

ARCHITECTURES = {"BertForMaskedLM": "bert", "RobertaForMaskedLM": "roberta"}
# transformers' defaults of the fields zoo reads, for config.json files that leave them out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": {"max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
             "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
             "intermediate_size": 3072, "tie_word_embeddings": True},
    "roberta": {"max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 1,
                "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                "intermediate_size": 3072, "tie_word_embeddings": True},
}  # fmt: skip
# Fields of the network zoo's BERT has one way only: (field, the value it must have, transformers' default).
FIXED_FIELDS = (
    ("position_embedding_type", "absolute", "absolute"),
    ("is_decoder", False, False),
    ("add_cross_attention", False, False),
    ("tie_word_embeddings", True, True),
)
# The prefix of the encoder's names and the MLM head's names, per architecture.
PREFIXES = {"bert": "bert.", "roberta": "roberta."}
HEADS = {
    "bert": {"dense": "cls.predictions.transform.dense", "norm": "cls.predictions.transform.LayerNorm",
             "decoder": "cls.predictions.decoder", "bias": "cls.predictions.bias"},
    "roberta": {"dense": "lm_head.dense", "norm": "lm_head.layer_norm", "decoder": "lm_head.decoder",
                "bias": "lm_head.bias"},
}  # fmt: skip
_EMBEDDING_NAMES = [
    ("embeddings.word_embeddings.weight", "token_embedding.weight"),
    ("embeddings.position_embeddings.weight", "position_embedding.weight"),
    ("embeddings.token_type_embeddings.weight", "token_type_embedding.weight"),
    ("embeddings.LayerNorm.weight", "embedding_norm.weight"),
    ("embeddings.LayerNorm.bias", "embedding_norm.bias"),
]
_BLOCK_NAMES = [
    ("attention.output.dense", "self_attn.out_proj"),
    ("attention.output.LayerNorm", "norm1"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
    ("output.LayerNorm", "norm2"),
]


def architecture_of(config: dict[str, Any]) -> str:
    """bert | roberta, from config.json's `architectures` (or its model_type when it names none)."""
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    model_type = config.get("model_type")
    if not names and model_type in PREFIXES:
        return model_type
    raise ValueError(
        f"unsupported Hugging Face architecture {(names or [model_type])[0]!r}; valid: {', '.join(ARCHITECTURES)}"
    )


def bert_config_from_huggingface(config: dict[str, Any]) -> dict[str, Any]:
    """BERTConfig fields (as a dict) of a BertForMaskedLM / RobertaForMaskedLM config.json."""
    arch = architecture_of(config)
    config = {**DEFAULTS[arch], **config}
    for name, value, default in FIXED_FIELDS:
        if config.get(name, default) != value:
            raise ValueError(f"unsupported Hugging Face field {name}={config[name]!r}; valid: {value!r}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if hidden % heads != 0:
        raise ValueError(f"unsupported Hugging Face fields hidden_size={hidden} with num_attention_heads={heads}")
    activation = from_huggingface_activation(config["hidden_act"])
    if arch == "roberta" and activation != "gelu":
        raise ValueError(
            f"unsupported Hugging Face field hidden_act={config['hidden_act']!r} for RoBERTa (its MLM head is GELU "
            "whatever the blocks use; zoo's head uses the blocks' activation); valid: 'gelu'"
        )
    return {
        "vocab_size": config["vocab_size"],
        "max_length": config["max_position_embeddings"],
        "type_vocab_size": config["type_vocab_size"],
        "padding_id": config["pad_token_id"],
        "position_ids": arch,
        "dim": hidden,
        "depth": config["num_hidden_layers"],
        "num_heads": heads,
        "mlp_dim": config["intermediate_size"],
        "dropout": float(config["hidden_dropout_prob"]),
        "activation": activation,
        "norm_eps": float(config["layer_norm_eps"]),
        "attention": {"dropout": float(config["attention_probs_dropout_prob"])},
    }


def state_from_huggingface(state: dict[str, torch.Tensor], config: Any, arch: str) -> dict[str, torch.Tensor]:
    """zoo BERT state dict of a BertForMaskedLM / RobertaForMaskedLM state dict: query, key and value stacked into
    in_proj (rows q, then k, then v); the decoder's bias is the head's `bias` (transformers ties the two). A tensor
    the state lacks is left out (the model's load_state_dict names it)."""
    prefix, head = PREFIXES[arch], HEADS[arch]
    out = {}
    for theirs, ours in _EMBEDDING_NAMES:
        if prefix + theirs in state:
            out[ours] = state[prefix + theirs]
    for i in range(config.depth):
        hf, zoo = f"{prefix}encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            parts = [state.get(f"{hf}attention.self.{p}.{kind}") for p in ("query", "key", "value")]
            if all(p is not None for p in parts):
                out[f"{zoo}self_attn.in_proj.{kind}"] = torch.cat(parts)
            for theirs, ours in _BLOCK_NAMES:
                if f"{hf}{theirs}.{kind}" in state:
                    out[f"{zoo}{ours}.{kind}"] = state[f"{hf}{theirs}.{kind}"]
    for part in ("dense", "norm"):
        for kind in ("weight", "bias"):
            if f"{head[part]}.{kind}" in state:
                out[f"mlm_head.{part}.{kind}"] = state[f"{head[part]}.{kind}"]
    bias = state.get(head["bias"], state.get(f"{head['decoder']}.bias"))
    if bias is not None:
        out["mlm_head.decoder.bias"] = bias
    return out


def state_to_huggingface(state: dict[str, torch.Tensor], config: Any, arch: str) -> dict[str, torch.Tensor]:
    """The inverse of state_from_huggingface, with transformers' names (the tied decoder weight and bias written
    as the head's own, as its state dict lists them); the pooler is left out."""
    prefix, head = PREFIXES[arch], HEADS[arch]
    out = {prefix + theirs: state[ours] for theirs, ours in _EMBEDDING_NAMES if ours in state}
    for i in range(config.depth):
        hf, zoo = f"{prefix}encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            fused = state[f"{zoo}self_attn.in_proj.{kind}"]
            for name, part in zip(("query", "key", "value"), fused.chunk(3)):
                out[f"{hf}attention.self.{name}.{kind}"] = part
            for theirs, ours in _BLOCK_NAMES:
                out[f"{hf}{theirs}.{kind}"] = state[f"{zoo}{ours}.{kind}"]
    for part in ("dense", "norm"):
        for kind in ("weight", "bias"):
            out[f"{head[part]}.{kind}"] = state[f"mlm_head.{part}.{kind}"]
    out[f"{head['decoder']}.weight"] = state["mlm_head.decoder.weight"]
    out[f"{head['decoder']}.bias"] = state["mlm_head.decoder.bias"]
    out[head["bias"]] = state["mlm_head.decoder.bias"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def huggingface_config(config: Any) -> tuple[str, dict[str, Any]]:
    """(architecture class name, config.json fields) of a zoo BERTConfig: RobertaForMaskedLM for
    position_ids=roberta, BertForMaskedLM otherwise. ValueError naming what neither has."""
    attention = config.attention
    problems = []
    if attention.variant != "full":
        problems.append(f"attention.variant={attention.variant!r} (valid: full)")
    if attention.rope or attention.position_bias is not None:
        problems.append("positions inside attention (valid: attention.rope=false, no position_bias)")
    if attention.kv_heads not in (None, config.num_heads):
        problems.append(f"attention.kv_heads={attention.kv_heads} (valid: null, one key/value head per query head)")
    if config.position_ids == "roberta" and config.activation != "gelu":
        problems.append(f"activation={config.activation!r} with position_ids=roberta (RoBERTa's head: gelu)")
    if problems:
        raise ValueError(f"BERT and RoBERTa have none of: {'; '.join(problems)}")
    fields: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim or 4 * config.dim,
        "hidden_act": to_huggingface_activation(config.activation),
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": config.max_length,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.padding_id,
        "tie_word_embeddings": True,
    }
    if config.position_ids == "roberta":
        fields.update(bos_token_id=None, eos_token_id=None)
    return {v: k for k, v in ARCHITECTURES.items()}[config.position_ids], fields
