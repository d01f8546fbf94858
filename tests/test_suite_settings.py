"""How the test suite itself runs: threads per pytest-xdist worker (tests/conftest.py), runs of run.py in the test's
process that leave nothing behind (tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

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
