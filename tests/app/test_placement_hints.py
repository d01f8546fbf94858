"""The line for an attention option a model cannot take where it was put (zoo/app/hints.py placement_hint): at most
about 300 characters, and every placement it names builds when composed as the line says."""

from __future__ import annotations

import re

import hydra
import pytest
from hydra.errors import InstantiationException

from tests.helpers import compose_config
from zoo.app.hints import HINT_ROOM, placement_hint
from zoo.app.reporting import unwrap
from zoo.errors import PlacementError


def build(overrides: list[str]) -> None:
    """The task of these overrides with its network built (GPT's vocabulary, from the data's tokenizer when it
    trains, set here); an error of the network is raised as itself, not as Hydra's wrapper."""
    cfg = compose_config(overrides)
    if "vocab_size" in cfg.model.net and cfg.model.net.vocab_size is None:
        cfg.model.net.vocab_size = 64
    try:
        hydra.utils.instantiate(cfg.model, _convert_="all")
    except InstantiationException as error:
        raise unwrap(error) from None


def placements(hint: str, model: str, option: list[str]) -> list[list[str]]:
    """The overrides of each placement a hint names: `model=vit` keeps the option as given; `model=clip <override>`
    and the placement in the same family (`in model=translation it fits <override> (where)`) replace it."""
    if (same := re.fullmatch(r"; in model=\S+ it fits (.*)", hint)) is not None:
        ways = [re.sub(r" \([^()]*\)$", "", way) for way in same.group(1).split(" or ")]
        return [[model, *way.split()] for way in ways]
    named = re.fullmatch(r"; .*? has no .*? attention; \S+ fits (.*)", hint)
    assert named is not None, hint
    return [[way, *option] if " " not in way else way.split() for way in named.group(1).split(", ")]


CASES = [
    ("model=llama", ["attention=compressed"]),
    ("model=gpt", ["attention=compressed"]),
    ("model=translation", ["attention=compressed"]),
    ("model=vit", ["attention.position_bias=alibi"]),
    ("model=clip", ["attention.position_bias=t5"]),
]


@pytest.mark.parametrize(("model", "option"), CASES, ids=[f"{m} {' '.join(o)}" for m, o in CASES])
def test_a_placement_line_is_short_and_every_placement_it_names_builds(model: str, option: list[str]) -> None:
    try:
        build([model, *option])
    except PlacementError as error:
        refused = error
    else:
        raise AssertionError(f"{model} {option} builds: no line to check")
    target = compose_config([model]).model._target_
    message = str(refused)
    hint = placement_hint(refused, target, model.split("=")[1], HINT_ROOM - len(f"error: {message}"))
    assert hint and len(f"error: {message}{hint}") <= HINT_ROOM, (len(message + hint), message + hint)
    ways = placements(hint, model, option)
    assert ways, hint
    for overrides in ways:
        build(overrides)  # raises if a named placement refuses the option too
