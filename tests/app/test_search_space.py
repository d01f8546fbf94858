"""A sweep's search space, read from Hydra's sweep grammar, becomes the same Optuna distributions and W&B sweep
parameters for every form (choice, range, interval, tag(log, interval), fixed values), and the W&B sweep config
that `wandb sweep` reads (method, metric, early stopping, the agent's command)."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from zoo.app.optuna_sweeper import make_pruner, make_sampler, optuna_distribution
from zoo.app.search_space import Choice, Interval, parse_search_space
from zoo.app.wandb_sweep import sweep_command, wandb_early_terminate, wandb_parameter, wandb_sweep_config
from zoo.errors import UsageError

# form -> (what it parses to, its Optuna distribution, its W&B parameter)
FORMS = {
    "choice(32, 64, 128)": (
        Choice((32, 64, 128), ("32", "64", "128")),
        CategoricalDistribution((32, 64, 128)),
        {"values": [32, 64, 128]},
    ),
    "full,local": (
        Choice(("full", "local"), ("full", "local")),
        CategoricalDistribution(("full", "local")),
        {"values": ["full", "local"]},
    ),
    "choice(true, 'a b', [1, 2])": (
        Choice((True, "a b", "[1,2]"), ("True", "a\\ b", "[1,2]")),
        CategoricalDistribution((True, "a b", "[1,2]")),
        {"values": [True, "a\\ b", "[1,2]"]},  # the agent passes key=<str(value)>: the space must survive it
    ),
    "range(2, 8, 2)": (Interval(2, 6, step=2), IntDistribution(2, 6, step=2), {"values": [2, 4, 6]}),
    "range(0.0, 0.3, 0.1)": (
        Choice((0.0, 0.1, 0.2), ("0.0", "0.1", "0.2")),
        CategoricalDistribution((0.0, 0.1, 0.2)),
        {"values": [0.0, 0.1, 0.2]},
    ),
    "interval(0.0, 0.2)": (
        Interval(0.0, 0.2),
        FloatDistribution(0.0, 0.2),
        {"distribution": "uniform", "min": 0.0, "max": 0.2},
    ),
    "interval(1, 10)": (Interval(1, 10), IntDistribution(1, 10), {"distribution": "int_uniform", "min": 1, "max": 10}),
    "tag(log, interval(3e-4, 5e-3))": (
        Interval(3e-4, 5e-3, log=True),
        FloatDistribution(3e-4, 5e-3, log=True),
        {"distribution": "log_uniform_values", "min": 3e-4, "max": 5e-3},
    ),
    "tag(log, interval(16, 256))": (
        Interval(16, 256, log=True),
        IntDistribution(16, 256, log=True),
        {"distribution": "q_log_uniform_values", "min": 16, "max": 256, "q": 1},
    ),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_search_form_becomes_the_same_optuna_distribution_and_wandb_parameter(form: str) -> None:
    dimension, distribution, parameter = FORMS[form]
    space = parse_search_space({"key": form})
    assert space.searched == {"key": dimension} and space.fixed == {}
    assert optuna_distribution(dimension) == distribution
    assert wandb_parameter(dimension) == parameter


def test_fixed_values_pass_through_and_a_later_entry_wins() -> None:
    space = parse_search_space(
        {"attention": "choice(full, local)", "model.net.dim": "choice(16, 32)"},
        ["hparams_search=vit_optuna", "attention=local", "model.net.depth=2,4", "+trainer.foo=1"],
    )
    assert set(space.searched) == {"model.net.dim", "model.net.depth"}  # attention=local fixes the searched one
    assert list(space.fixed.values()) == ["hparams_search=vit_optuna", "attention=local", "+trainer.foo=1"]
    overrides = space.overrides({"model.net.dim": 32, "model.net.depth": 4})
    assert overrides == ["hparams_search=vit_optuna", "attention=local", "+trainer.foo=1", "model.net.dim=32",
                         "model.net.depth=4"]  # fmt: skip
    interval = parse_search_space({"lr": "tag(log, interval(1e-4, 1e-2))"})
    assert interval.overrides({"lr": 0.00123}) == ["lr=0.00123"]


@pytest.mark.parametrize(
    "form", ["interval(0.2, 0.1)", "tag(log, interval(0.0, 1.0))", "range(5, 5)", "glob(*)"], ids=str
)
def test_a_form_that_cannot_be_searched_is_a_one_line_error(form: str) -> None:
    with pytest.raises(UsageError, match="key: ") as error:
        parse_search_space({"key": form})
    assert "\n" not in str(error.value)


def test_glob_over_a_group_expands_with_hydras_config_loader() -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    from tests.helpers import CONF

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF)))
    space = parse_search_space({"attention": "glob(l*)"}, config_loader=loader)
    expected = tuple(sorted(path.stem for path in (CONF / "attention").glob("l*.yaml")))
    assert "local" in expected and space.searched["attention"].values == expected


def test_samplers_and_pruners_are_built_from_their_configs_and_a_resumed_study_reseeds() -> None:
    import optuna

    space = parse_search_space({"x": "choice(1, 2, 3, 4, 5, 6, 7, 8)", "y": "range(1, 4)"})
    config = {"_target_": "optuna.samplers.RandomSampler", "seed": 3}

    def draws(offset: int) -> list:
        study = optuna.create_study(sampler=make_sampler(config, space, seed_offset=offset))
        distributions = {k: optuna_distribution(d) for k, d in space.searched.items()}
        return [study.ask(distributions).params for _ in range(6)]

    assert draws(0) == draws(0) and draws(0) != draws(6)  # a resumed study does not repeat the first draws
    grid = make_sampler({"_target_": "optuna.samplers.GridSampler", "seed": 0}, space, 0)
    assert isinstance(grid, optuna.samplers.GridSampler)
    with pytest.raises(UsageError, match="the grid sampler needs discrete values; z"):
        make_sampler({"_target_": "optuna.samplers.GridSampler"}, parse_search_space({"z": "interval(0, 1.0)"}), 0)
    assert isinstance(make_pruner(None), optuna.pruners.NopPruner)
    median = make_pruner({"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 7})
    assert isinstance(median, optuna.pruners.MedianPruner) and median._n_startup_trials == 7


def test_wandb_sweep_config_has_method_metric_stopping_run_cap_and_the_agents_command() -> None:
    space = parse_search_space(
        {"model.optimizer.lr": "tag(log, interval(3e-4, 5e-3))", "attention": "choice(full, local)"},
        ["hparams_search=vit_optuna", "data.batch_size=64"],
    )
    hyperband = {"_target_": "optuna.pruners.HyperbandPruner", "min_resource": 2, "reduction_factor": 3}
    config = wandb_sweep_config(
        space, metric="val/acc", direction="max", sampler={"_target_": "optuna.samplers.TPESampler"},
        pruner=hyperband, n_trials=20, name="vit", project="zoo",
    )  # fmt: skip
    assert config["method"] == "bayes"
    assert config["metric"] == {"name": "val/acc", "goal": "maximize"}
    assert config["early_terminate"] == {"type": "hyperband", "min_iter": 2, "eta": 3}
    assert config["run_cap"] == 20 and config["program"] == "run.py" and "entity" not in config
    assert config["command"] == ["${env}", "${interpreter}", "${program}", "hparams_search=vit_optuna",
                                 "data.batch_size=64", "hydra.mode=RUN", "logger=wandb",
                                 "${args_no_hyphens}"]  # fmt: skip
    random = wandb_sweep_config(space, metric="val/loss", direction="minimize",
                                sampler={"_target_": "optuna.samplers.RandomSampler"})  # fmt: skip
    assert random["method"] == "random" and random["metric"]["goal"] == "minimize"
    assert "early_terminate" not in random  # no pruner given
    assert wandb_early_terminate({"_target_": "optuna.pruners.MedianPruner"}) is None  # W&B has no median rule
    sha = wandb_early_terminate({"_target_": "optuna.pruners.SuccessiveHalvingPruner", "min_resource": "auto"})
    assert sha == {"type": "hyperband", "min_iter": 1, "eta": 3}
    assert sweep_command(["logger=[csv,wandb]"])[3:5] == ["logger=[csv,wandb]", "hydra.mode=RUN"]
    with pytest.raises(UsageError, match="grid sweep needs discrete values; model.optimizer.lr"):
        wandb_sweep_config(space, metric="m", direction="max", sampler={"_target_": "optuna.samplers.GridSampler"})
    with pytest.raises(UsageError, match="logger=wandb"):
        wandb_sweep_config(parse_search_space({"a": "1,2"}, ["logger=csv"]), metric="m", direction="max")
