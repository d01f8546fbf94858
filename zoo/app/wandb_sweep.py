"""W&B Sweeps drive zoo: the search space of `hparams_search=<model>_optuna` written as a W&B sweep config.

    python run.py hparams_search=vit_optuna hydra/sweeper=wandb     # writes <sweep dir>/wandb_sweep.yaml
    wandb sweep outputs/vit/multirun/<date>_<time>/wandb_sweep.yaml  # registers it, prints the sweep id
    wandb agent <entity>/<project>/<sweep id>                        # from the zoo folder; one per GPU or machine

The agent starts `python run.py <the sweep's fixed overrides> hydra.mode=RUN logger=wandb key=value ...`: each
run is a plain zoo run of the same config an Optuna trial would get, logging to W&B, where the sweep reads
its metric. Translation of Hydra's sweep grammar (zoo/app/search_space.py):

    choice(a, b) / a,b               -> values: [a, b]
    range(2, 8, 2)                   -> values: [2, 4, 6]
    interval(lo, hi)                 -> distribution: uniform (int_uniform if both ends are ints), min, max
    tag(log, interval(lo, hi))       -> distribution: log_uniform_values (q_log_uniform_values for ints), min, max
    sampler TPE / random / grid      -> method: bayes / random / grid
    pruner hyperband, successive halving -> early_terminate: hyperband (min_iter, eta); W&B has no median rule
    n_trials                         -> run_cap
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from zoo.app.overrides import is_group
from zoo.app.reporting import closest
from zoo.app.search_space import DIRECTIONS, Choice, Dimension, SearchSpace, parse_search_space
from zoo.errors import UsageError

log = logging.getLogger("zoo")

SWEEP_FILE = "wandb_sweep.yaml"
METHODS = {"TPESampler": "bayes", "RandomSampler": "random", "GridSampler": "grid"}


def wandb_value(value: Any, text: str) -> Any:
    """A choice as W&B lists it; the agent passes it back as `key=<str(value)>`, so strings that Hydra would read
    differently (special characters) are given as their override text."""
    if isinstance(value, str) and value != text:
        return text
    return value


def wandb_parameter(dimension: Dimension) -> dict[str, Any]:
    """One search-space dimension as a W&B sweep parameter."""
    if isinstance(dimension, Choice):
        return {"values": [wandb_value(v, t) for v, t in zip(dimension.values, dimension.texts)]}
    if dimension.step is not None:
        return {"values": dimension.grid()}
    if dimension.log:
        if dimension.integer:
            return {"distribution": "q_log_uniform_values", "min": dimension.low, "max": dimension.high, "q": 1}
        return {"distribution": "log_uniform_values", "min": dimension.low, "max": dimension.high}
    distribution = "int_uniform" if dimension.integer else "uniform"
    return {"distribution": distribution, "min": dimension.low, "max": dimension.high}


def wandb_method(sampler: Any) -> str:
    target = str((sampler or {}).get("_target_", "TPESampler"))
    return METHODS.get(target.rsplit(".", 1)[-1], "bayes")


def wandb_early_terminate(pruner: Any) -> dict[str, Any] | None:
    """Hyperband / successive halving as W&B's hyperband stopping (its iterations: the metric's logged values,
    i.e. validations, as for zoo's pruning); other pruners have no W&B counterpart."""
    target = str((pruner or {}).get("_target_", "")).rsplit(".", 1)[-1]
    if target not in ("HyperbandPruner", "SuccessiveHalvingPruner"):
        return None
    min_resource = pruner.get("min_resource", 1)
    return {
        "type": "hyperband",
        "min_iter": min_resource if isinstance(min_resource, int) else 1,
        "eta": int(pruner.get("reduction_factor", 3)),
    }


def sweep_command(fixed: list[str]) -> list[str]:
    """The agent's command: run.py with the sweep's fixed overrides, as one plain run logging to W&B."""
    keys = {override.split("=", 1)[0].lstrip("+~") for override in fixed}
    logger = [] if "logger" in keys else ["logger=wandb"]
    return ["${env}", "${interpreter}", "${program}", *fixed, "hydra.mode=RUN", *logger, "${args_no_hyphens}"]


def wandb_sweep_config(
    space: SearchSpace,
    *,
    metric: str,
    direction: str,
    sampler: Any = None,
    pruner: Any = None,
    n_trials: int | None = None,
    name: str | None = None,
    project: str | None = None,
    entity: str | None = None,
    program: str = "run.py",
) -> dict[str, Any]:
    """The W&B sweep config (a dict to save as YAML) searching `space` for the best `metric`."""
    if not space.searched:
        raise UsageError("the sweep searches nothing: hydra.sweeper.params has no choice(...) or interval(...)")
    method = wandb_method(sampler)
    parameters = {key: wandb_parameter(dimension) for key, dimension in space.searched.items()}
    if method == "grid":
        continuous = [key for key, parameter in parameters.items() if "values" not in parameter]
        if continuous:
            raise UsageError(f"a W&B grid sweep needs discrete values; {', '.join(continuous)} are intervals")
    fixed = list(space.fixed.values())
    if any(o.split("=", 1)[0] == "logger" and "wandb" not in o.split("=", 1)[1] for o in fixed):
        raise UsageError(
            "a W&B sweep reads its metric from W&B, so its runs need a W&B logger: logger=wandb or "
            "e.g. logger=[csv,wandb]"
        )
    config: dict[str, Any] = {
        "program": program,
        "name": name,
        "project": project,
        "entity": entity,
        "method": method,
        "metric": {"name": metric, "goal": DIRECTIONS[direction]},
        "parameters": parameters,
        "early_terminate": wandb_early_terminate(pruner),
        "run_cap": n_trials,
        "command": sweep_command(fixed),
    }
    return {key: value for key, value in config.items() if value is not None}


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether `key` (dotted) is in `cfg`, whatever its value (null, or an interpolation not resolvable here)."""
    node: Any = cfg
    for part in key.split("."):
        if not OmegaConf.is_dict(node) or part not in node:
            return False
        node = node._get_node(part)
    return True


def check_sweep_keys(space: SearchSpace, compose: Callable[[list[str]], DictConfig]) -> None:
    """Every key the sweep sets must be in the config its runs compose (`compose`: overrides -> config), else one
    UsageError naming it: W&B's agents would start every run with it and Hydra would refuse each one. A searched
    config group changes the config's keys: a key counts if it is in the config of any of that group's options.
    Keys added with + (or ++) and hydra's own are not checked."""
    groups = {key: d for key, d in space.searched.items() if isinstance(d, Choice) and is_group(key.split("@", 1)[0])}
    base = [*space.fixed.values(), *(f"{key}={d.texts[0]}" for key, d in groups.items())]
    configs = [compose(base)]
    configs += [compose([*base, f"{key}={text}"]) for key, d in groups.items() for text in d.texts[1:]]
    for key in [*space.searched, *space.fixed]:
        if key in groups or key.startswith(("+", "~", "hydra")) or is_group(key.split("@", 1)[0]):
            continue
        if any(has_key(cfg, key) for cfg in configs):
            continue
        parent, _, name = key.rpartition(".")
        valid = sorted({str(k) for cfg in configs if has_key(cfg, parent) or not parent
                        for k in (OmegaConf.select(cfg, parent) if parent else cfg) or {}})  # fmt: skip
        where = f"keys in {parent}" if parent else "keys"
        raise UsageError(
            f"the sweep sets {key!r}, which is not in the config its runs compose; "
            f"{closest(name, [k for k in valid if not k.startswith('_')], where)} (nothing written: every run "
            "would fail)"
        )


def unconditional(space: SearchSpace, conditions: dict[str, dict[str, list[Any]]]) -> list[str]:
    """W&B has no conditional parameters: a key searched only where another searched key takes some values
    (hydra.sweeper.conditions, e.g. the window only in local attention's trials) would reach every run, and a
    run of another variant refuses it. Such keys leave the W&B search space (at their defaults); a condition on
    a key the command line fixes holds or fails for every run alike. Returns the keys left out; `space` changes."""
    left_out = []
    for key, when in conditions.items():
        if key not in space.searched:
            continue
        holds = all(
            other not in space.searched and str(space.fixed.get(other, "")).split("=", 1)[-1] in map(str, values)
            for other, values in when.items()
        )
        if not holds:
            del space.searched[key]
            left_out.append(key)
    return left_out


class WandbSweep:
    """A "sweeper" that runs nothing: it writes the sweep's search space as <sweep dir>/wandb_sweep.yaml and
    says how to start it (conf/hydra/sweeper/wandb.yaml: the Optuna settings plus `program`)."""

    def __init__(self, direction: str, n_trials: int, params: Any = None, sampler: Any = None, pruner: Any = None,
                 study_name: str | None = None, program: str = "run.py", conditions: Any = None,
                 **_optuna_only: Any) -> None:  # fmt: skip
        if str(direction) not in DIRECTIONS:
            raise UsageError(f"unknown hydra.sweeper.direction {direction!r}; valid choices: maximize, minimize")
        self.direction = str(direction)
        self.n_trials = n_trials
        self.params = OmegaConf.to_container(params, resolve=False) if OmegaConf.is_config(params) else params
        self.sampler = OmegaConf.to_container(sampler) if OmegaConf.is_config(sampler) else sampler
        self.pruner = OmegaConf.to_container(pruner) if OmegaConf.is_config(pruner) else pruner
        self.name = study_name
        self.program = program
        self.conditions = OmegaConf.to_container(conditions) if OmegaConf.is_config(conditions) else conditions or {}
        self.config: DictConfig | None = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def sweep(self, arguments: list[str]) -> None:
        assert self.config is not None
        space = parse_search_space(self.params, arguments, self.hydra_context.config_loader)
        left_out = unconditional(space, self.conditions)
        loader = self.hydra_context.config_loader
        check_sweep_keys(space, lambda overrides: loader.load_sweep_config(self.config, overrides))
        wandb = OmegaConf.select(self.config, "logger.wandb", default=None) or {}
        sweep_config = wandb_sweep_config(
            space,
            metric=str(self.config.optimized_metric),
            direction=self.direction,
            sampler=self.sampler,
            pruner=self.pruner,
            n_trials=self.n_trials,
            name=self.name,
            project=wandb.get("project", "zoo"),
            entity=wandb.get("entity"),
            program=self.program,
        )
        path = Path(str(self.config.hydra.sweep.dir)) / SWEEP_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(sweep_config, sort_keys=False))
        stopping = "" if "early_terminate" in sweep_config else "; no early stopping (W&B has only hyperband)"
        if left_out:
            stopping += (
                f"; left out, as W&B has no conditional parameters: {', '.join(left_out)} (Optuna searches them)"
            )
        method, goal = sweep_config["method"], sweep_config["metric"]["goal"]
        print(
            f"wrote {path}: W&B sweep ({method}, {goal} {self.config.optimized_metric}, "
            f"{len(sweep_config['parameters'])} parameters, {self.n_trials} runs{stopping}). Start it with:\n"
            f"  wandb sweep {path}\n"
            f"  wandb agent <entity>/<project>/<sweep id>   # in {Path.cwd()}, once per GPU or machine"
        )
