"""The activation functions zoo's MLPs use, by name, and their names in Hugging Face configs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x): the GELU approximation of OpenAI's CLIP."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "relu": F.relu,
    "quick_gelu": quick_gelu,
    "silu": F.silu,
}

# transformers' `activation_function` / `hidden_act` names -> zoo's; the first name of each is the one
# zoo writes when exporting.
HUGGINGFACE_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid choices: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def from_huggingface_activation(name: str) -> str:
    """A transformers activation name -> zoo's (one-line ValueError for one zoo does not have)."""
    if name not in HUGGINGFACE_ACTIVATIONS:
        raise ValueError(
            f"unsupported Hugging Face activation {name!r}; valid choices: {sorted(HUGGINGFACE_ACTIVATIONS)}"
        )
    return HUGGINGFACE_ACTIVATIONS[name]


def to_huggingface_activation(name: str) -> str:
    """zoo's activation name -> the transformers name (the first listed for it)."""
    for theirs, ours in HUGGINGFACE_ACTIVATIONS.items():
        if ours == name:
            return theirs
    valid = sorted(set(HUGGINGFACE_ACTIVATIONS.values()))
    raise ValueError(f"Hugging Face has no activation for zoo's {name!r}; valid choices: {valid}")
