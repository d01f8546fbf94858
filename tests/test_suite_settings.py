"""How the test suite itself runs: threads per pytest-xdist worker (tests/conftest.py), runs of run.py in the test's
process that leave nothing behind (tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests import helpers
from tests.conftest import worker_threads
from tests.helpers import run_in_process


def test_a_test_process_computes_with_its_share_of_the_cores(request: pytest.FixtureRequest) -> None:
    expected = worker_threads(request.config)
    if hasattr(request.config, "workerinput") and "OMP_NUM_THREADS" in os.environ:
        expected = int(os.environ["OMP_NUM_THREADS"])  # the caller's own setting is kept
    assert torch.get_num_threads() == expected


def test_a_run_started_as_a_process_under_workers_gets_the_same_share(request: pytest.FixtureRequest) -> None:
    if not hasattr(request.config, "workerinput"):
        pytest.skip("only under pytest-xdist workers (the suite's own command: -n auto)")
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    assert int(child.stdout) == torch.get_num_threads()


@pytest.mark.parametrize(("cores", "workers", "threads"), [(2, 2, 1), (2, 1, 2), (16, 1, 2), (16, 4, 2), (1, 2, 1)])
def test_the_share_is_the_cores_over_the_workers_at_most_two(monkeypatch, cores, workers, threads) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    config = type("Config", (), {"workerinput": {"workercount": workers}})()
    assert worker_threads(config) == threads


def test_a_sweep_run_in_process_leaves_no_hydra_run_behind(tmp_path) -> None:
    """zoo's loggers ask Hydra whether they run in a sweep; a sweep run in-process by an earlier test must not
    answer for the next one (it named a W&B run after that sweep's directory)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    before = HydraConfig.instance().cfg
    code, out, err = run_in_process(["-m", "model=vit", "trainer.fast_dev_run=true", "print_config=false",
                                     "logger=csv", f"hydra.sweep.dir={tmp_path}"])  # fmt: skip
    assert code == 0, (out + err)[-3000:]
    assert (tmp_path / "0").is_dir()  # it ran, as a sweep's job 0
    assert HydraConfig.instance().cfg is before and not GlobalHydra.instance().is_initialized()


# -- the two tiers (tests/tiers.py): what a test does puts it in the end-to-end tier --------------------------
def _calls_run_cli() -> None:
    run_cli_alias(["model=vit"])


def _calls_run_in_process_through_the_module() -> None:
    helpers.run_in_process(["model=vit"])


def _calls_a_helper_that_starts_a_process() -> None:
    _helper_that_starts_a_process()


def _helper_that_starts_a_process() -> None:
    subprocess.run(["true"])


def _imports_its_own_helper() -> None:
    from tests.helpers import run_in_process as run

    run(["model=vit"])


def _calls_zoo_app_run() -> None:
    import zoo.app

    zoo.app.run(["model=vit"])


def _imports_zoo_app_run() -> None:
    from zoo.app import run

    run(["model=vit"])


def _calls_run_imported_at_the_top() -> None:
    zoo_run(["model=vit"])


def _runs_a_benchmark() -> None:
    from experiments import attention_benchmark

    attention_benchmark.main(["--quick"])


def _reads_a_benchmarks_pure_function() -> None:
    from experiments.study_stats import bootstrap_interval

    bootstrap_interval([0.5, 0.6], seed=0)


def _computes_in_this_process() -> None:
    torch.ones(3).sum()
    os.path.join("a", "b")


def _spawns_a_process_group() -> None:
    import torch.multiprocessing as mp

    mp.spawn(print, nprocs=2)


run_cli_alias = __import__("tests.helpers", fromlist=["run_cli"]).run_cli
zoo_run = __import__("zoo.app", fromlist=["run"]).run


@pytest.mark.parametrize(
    ("functions", "reason"),
    [
        ((_calls_run_cli,), "runs zoo end to end (run_cli)"),
        ((_calls_run_in_process_through_the_module,), "runs zoo end to end (run_in_process)"),
        ((_calls_a_helper_that_starts_a_process,), "starts a process (subprocess)"),
        ((_imports_its_own_helper,), "runs zoo end to end (run_in_process)"),
        ((_calls_zoo_app_run,), "runs zoo end to end (zoo.app.run)"),
        ((_imports_zoo_app_run,), "runs zoo end to end (zoo.app.run)"),
        ((_calls_run_imported_at_the_top,), "runs zoo end to end (zoo.app.run)"),
        ((_runs_a_benchmark,), "runs a benchmark (experiments)"),
        ((_spawns_a_process_group,), "starts a process (multiprocessing)"),
        ((_computes_in_this_process, _calls_run_cli), "runs zoo end to end (run_cli)"),  # a fixture that runs zoo
        ((_reads_a_benchmarks_pure_function,), None),
        ((_computes_in_this_process,), None),
    ],
)
def test_the_tier_is_what_the_test_and_its_fixtures_do(functions, reason) -> None:
    from tests.tiers import end_to_end_reason

    assert end_to_end_reason(functions) == reason


def test_the_fast_tier_refuses_to_start_a_run(monkeypatch) -> None:
    """A test the rule missed fails in the fast tier instead of slowing it: the run helpers refuse there."""
    from tests import helpers

    monkeypatch.setattr(helpers, "END_TO_END_ALLOWED", False)
    for start in (lambda: helpers.run_in_process(["model=vit"]), lambda: helpers.run_cli(["model=vit"])):
        with pytest.raises(AssertionError, match="in the fast tier: tests/tiers.py did not see"):
            start()


def test_the_session_runs_one_tier_and_marks_each_end_to_end_test_with_its_reason(request) -> None:
    """This test is fast, so this session is the fast tier: nothing collected here carries the e2e mark, and the
    run helpers refuse. (The e2e session's own check is the reverse, in the same rule.)"""
    from tests import helpers

    assert not request.config.getoption("--e2e")
    assert request.node.get_closest_marker("e2e") is None
    assert not helpers.END_TO_END_ALLOWED
    assert all(item.get_closest_marker("e2e") is None for item in request.session.items)
