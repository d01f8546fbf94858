"""Reading Hydra-style overrides (`key=value`) and the config groups in conf/: shared by the command-line
checks (cli.py) and the one-line error messages (reporting.py). Kept free of torch and Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parents[2] / "conf"


def split_override(arg: str) -> tuple[str, str] | None:
    """`+model.net.dim=64` -> ("model.net.dim", "64"); None for flags and `~key` deletions."""
    if arg.startswith(("-", "~")) or "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    return key.lstrip("+"), value


def group_options(group: str, conf: Path = CONF) -> list[str]:
    """The options of conf/<group>/: its yaml files. A sub-folder holds what the options pull in through their
    defaults list (conf/attention/base/), not options of the group."""
    return sorted(p.stem for p in (conf / group).glob("*.yaml"))


def group_option(group: str, option: str, conf: Path = CONF) -> dict[str, Any]:
    """conf/<group>/<option>.yaml as Hydra composes it (its defaults list applied), as a plain dict."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf / group), version_base="1.3"):
            return OmegaConf.to_container(compose(config_name=option), resolve=True)
    finally:
        GlobalHydra.instance().clear()


def is_group(key: str, conf: Path = CONF) -> bool:
    return not key.startswith("hydra") and (conf / key).is_dir()


def compose_defaults(args: list[str]) -> Any:
    """The config these arguments select with every value at its default (only group choices applied;
    a sweep's first choice); None if it cannot be composed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    choices = []
    for arg in args:
        parsed = split_override(arg)
        if parsed and is_group(parsed[0].split("@", 1)[0]):
            choices.append(f"{arg.split('=', 1)[0]}={parsed[1].split(',')[0]}")
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=choices)
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()
