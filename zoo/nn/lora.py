"""LoRA (Hu et al. 2021) on any zoo model, through the `peft` library: low-rank adapters W + (alpha / r) B A on
the blocks' projections, the base weights frozen.

Why peft: it wraps zoo's nn.Linear projections in place (`inject_adapter_in_model`), so the model stays the same
class with the same forward, generate and caches, and the adapters are the reference implementation (init, scaling,
dropout, merge) rather than a copy of it. Targets are the self-attention's fused q/k/v `in_proj` and `out_proj`
("attention") and the MLP's `fc1`, `fc2` and, gated, `gate` ("mlp"); cross-attention reads its projection's
weight directly, so its projections are never adapted. Adapter parameters are named `lora_A.default.weight` /
`lora_B.default.weight` under the module they adapt; the frozen base weight moves to `<module>.base_layer.weight`.
`modules_to_save` (peft's name) are trained in full besides the adapters: a task's new head (a ViT fine-tuned to
other classes starts its head from scratch, so adapters alone could not fit it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.errors import check_choice

TARGET_GROUPS = {"attention": ("in_proj", "out_proj"), "mlp": ("gate", "fc1", "fc2")}
TARGETS = ("attention", "mlp", "in_proj", "out_proj", "gate", "fc1", "fc2")
ADAPTER_MARK = "lora_"


@dataclass
class LoRAConfig:
    """rank 0: no adapters. alpha: the scale numerator (updates are scaled by alpha / rank). dropout: on the
    adapters' input. targets: attention | mlp, or module names (in_proj, out_proj, gate, fc1, fc2).
    modules_to_save: the network's modules by name (e.g. head) trained in full, kept in adapter checkpoints."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["attention", "mlp"])
    modules_to_save: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"model.lora.rank must be an int >= 0 (0: no LoRA), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be a number > 0, got {self.alpha!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}")
        self.targets = [self.targets] if isinstance(self.targets, str) else list(self.targets)
        if not self.targets:
            raise ValueError(f"model.lora.targets must name at least one of {', '.join(TARGETS)}")
        for target in self.targets:
            check_choice("model.lora.targets entry", target, TARGETS)
        self.modules_to_save = list(self.modules_to_save or [])

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def module_names(self) -> list[str]:
        names: list[str] = []
        for target in self.targets:
            names.extend(TARGET_GROUPS.get(target, (target,)))
        return sorted(set(names))


def add_lora(model: nn.Module, config: LoRAConfig) -> nn.Module:
    """Adapters on `model`'s target projections, in place; every other parameter frozen. Returns the model."""
    from peft import LoraConfig, inject_adapter_in_model

    names = "|".join(config.module_names())
    # Self-attention and MLP projections only (cross_attn's projection is read as a weight, never called).
    pattern = rf"(.*\.)?(self_attn\.({names})|mlp\.({names}))"
    if not any(re.fullmatch(pattern, name) for name, _ in model.named_modules()):  # before peft's own message
        present = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules()
                          if re.fullmatch(rf"(.*\.)?(self_attn|mlp)\.({'|'.join(TARGETS)})", name)})  # fmt: skip
        raise ValueError(
            f"model.lora.targets={list(config.targets)} match no projection of {type(model).__name__}; "
            f"its projections: {', '.join(present) or '(none)'}"
        )
    peft_config = LoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout, target_modules=pattern, bias="none"
    )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    inject_adapter_in_model(peft_config, model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(ADAPTER_MARK in name)
    for name in config.modules_to_save:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            valid = ", ".join(child for child, _ in model.named_children())
            raise ValueError(
                f"model.lora.modules_to_save entry {name!r} is not a module of {type(model).__name__}; valid: {valid}"
            ) from None
        module.requires_grad_(True)
    return model


def has_lora(model: nn.Module) -> bool:
    return any(ADAPTER_MARK in name for name, _ in model.named_parameters())


def adapter_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' entries of a state dict (what a LoRA checkpoint keeps besides naming its base)."""
    return {key: value for key, value in state.items() if ADAPTER_MARK in key}


def merge_lora(model: nn.Module) -> nn.Module:
    """W <- W + (alpha / r) B A in every adapted projection, which becomes a plain nn.Linear again (the model
    computes the same function, at the base's cost, with the base's parameter names). Returns the model."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    return model
