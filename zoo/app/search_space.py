"""A sweep's search space read once from Hydra's sweep grammar, for Optuna and for a W&B sweep config alike.

`hydra.sweeper.params` (conf/hparams_search/*.yaml) and sweep overrides on the command line use Hydra's forms:

    choice(32, 64, 128)   a,b,c            -> Choice: one of these values
    range(2, 8, 2)                         -> Interval with a step (2, 4, 6; the stop is excluded, as in Python)
    interval(0.0, 0.2)                     -> Interval: uniform between the ends (ints if both ends are ints)
    tag(log, interval(1e-4, 1e-2))         -> Interval on a log scale

Anything else (`model=vit`, `attention.window=8`) is fixed: every trial gets it as given. A later entry with
the same key wins, so `attention=local` on the command line fixes a searched `attention`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.errors import UsageError

# hydra.sweeper.direction: Optuna's words, or model_metric.mode's (conf/model/*.yaml) so one can follow the other
DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}


@dataclass(frozen=True)
class Choice:
    """One of `values` (str, int, float, bool or None); `texts` are the same values as override text."""

    values: tuple[Any, ...]
    texts: tuple[str, ...]

    def text(self, value: Any) -> str:
        return self.texts[self.values.index(value)]


@dataclass(frozen=True)
class Interval:
    """Between `low` and `high` (both included), uniform or on a log scale; with `step`, only low + k * step."""

    low: int | float
    high: int | float
    log: bool = False
    step: int | float | None = None

    @property
    def integer(self) -> bool:
        return all(isinstance(x, int) and not isinstance(x, bool) for x in (self.low, self.high, self.step or 1))

    def grid(self) -> list[int | float]:
        """The values of a stepped interval."""
        assert self.step is not None
        count = int(round((self.high - self.low) / self.step)) + 1
        return [self.low + i * self.step for i in range(count)]


Dimension = Choice | Interval


@dataclass
class SearchSpace:
    """What a sweep searches (`searched`: key -> Choice | Interval) and the overrides every trial shares (`fixed`)."""

    searched: dict[str, Dimension] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)  # key -> the override as written

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The command-line overrides of one trial: the fixed ones, then `key=value` for each sampled value."""
        sampled = []
        for key, value in params.items():
            dimension = self.searched[key]
            text = dimension.text(value) if isinstance(dimension, Choice) else repr(value)
            sampled.append(f"{key}={text}")
        return [*self.fixed.values(), *sampled]


def parse_search_space(
    params: Mapping[str, Any] | None, arguments: Sequence[str] = (), config_loader: Any = None
) -> SearchSpace:
    """The search space of `hydra.sweeper.params` followed by the sweep's command-line overrides; with Hydra's
    config loader, `glob(...)` over a config group's options works too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    space = SearchSpace()
    for override in OverridesParser.create(config_loader=config_loader).parse_overrides(lines):
        key = override.get_key_element()
        space.searched.pop(key, None)
        space.fixed.pop(key, None)
        if override.is_sweep_override():
            space.searched[key] = dimension_of(override)
        else:
            space.fixed[key] = override.input_line or f"{key}={override.get_value_element_as_str()}"
    return space


def dimension_of(override: Any) -> Dimension:
    """A parsed sweep override (choice, range, interval, tag(log, interval)) as a Choice or an Interval."""
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep, Transformer
    from hydra.errors import HydraException

    key = override.get_key_element()
    value = override.value()
    if override.is_choice_sweep():
        try:
            elements = list(override.sweep_iterator(transformer=Transformer.identity))
        except HydraException as error:  # glob(...) without a config loader
            raise UsageError(f"{key}: {override.get_value_string()} cannot be expanded here ({error})") from None
        # Optuna's categorical values are primitives; anything else (a list, a quoted string) as its text
        primitive = (str, int, float, bool, type(None))
        values = tuple(x if isinstance(x, primitive) else Transformer.str(x) for x in elements)
        return Choice(values, tuple(Transformer.str(x) for x in elements))
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        values = list(override.sweep_iterator(transformer=Transformer.identity))
        if not values:
            raise UsageError(f"{key}: {override.get_value_string()} is empty; valid: range(start, stop[, step])")
        if all(isinstance(x, int) for x in values):
            return Interval(min(values), max(values), step=abs(int(value.step)))
        return Choice(tuple(values), tuple(Transformer.str(x) for x in values))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        low, high = value.start, value.end
        log = "log" in value.tags
        if not low < high or (log and low <= 0):
            valid = "interval(low, high) with 0 < low < high" if log else "interval(low, high) with low < high"
            raise UsageError(f"{key}: {override.get_value_string()} is empty; valid: {valid}")
        if not (isinstance(low, int) and isinstance(high, int)):
            low, high = float(low), float(high)
        return Interval(low, high, log=log)
    raise UsageError(
        f"{key}: {override.get_value_string()!r} cannot be searched; valid: choice(...), range(...), "
        "interval(...), tag(log, interval(...))"
    )
