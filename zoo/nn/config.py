"""The base of every model's config: checks of architecture sizes, and conversion to and from plain dicts
(what YAML files, checkpoints and exported folders hold)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from zoo.attention import AttentionConfig
from zoo.errors import check_positive_int


@dataclasses.dataclass
class ModelConfig:
    """Subclasses are dataclasses. `sizes` names the fields that must be positive ints (an architecture with
    0 layers or heads is a mistake, never a model); `renamed` maps names older checkpoints used to today's.
    Fields typed as another ModelConfig or as AttentionConfig accept plain dicts and are converted."""

    family: ClassVar[str] = ""  # the model family, for messages: "gpt n_layer must be ..."
    sizes: ClassVar[tuple[str, ...]] = ()
    renamed: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, dict):
                kind = next((t for t in _classes(hints[item.name]) if _convertible(t)), None)
                if kind is not None:
                    setattr(self, item.name, kind(**value) if kind is AttentionConfig else kind.from_dict(value))
        for name in self.sizes:
            check_positive_int(f"{self.family} {name}".strip(), getattr(self, name), allow_none=_optional(hints[name]))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """The config a dict describes; names of older checkpoints are renamed."""
        values = {cls.renamed.get(key, key): value for key, value in dict(values).items()}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (nested configs as dicts, attention in its flat YAML form)."""
        out = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (AttentionConfig, ModelConfig)):
                value = value.to_dict()
            out[item.name] = value
        return out


def _classes(annotation: Any) -> list[Any]:
    return list(typing.get_args(annotation)) or [annotation]


def _convertible(kind: Any) -> bool:
    return isinstance(kind, type) and (kind is AttentionConfig or issubclass(kind, ModelConfig))


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)
