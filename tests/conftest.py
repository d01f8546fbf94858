"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from tests import helpers
from tests.tiers import E2E, end_to_end_reason

# What runs write to the user's cache (the throughput callback's CPU matmul probe, zoo/training/throughput.py) goes
# to a folder of this test session, removed at its end: the tests leave nothing in ~/.cache and read no figure an
# earlier session measured. Runs started as subprocesses inherit it.
if "ZOO_TEST_CACHE" not in os.environ:
    os.environ["ZOO_TEST_CACHE"] = os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="zoo-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ZOO_TEST_CACHE"], ignore_errors=True)


def worker_threads(config: pytest.Config) -> int:
    """The torch threads of one test process: its share of the cores under pytest-xdist, at most 2."""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    return max(1, min(2, (os.cpu_count() or 1) // workers))


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker computes with its share of the cores, and so do the runs it starts as processes
    (they inherit OMP_NUM_THREADS; one the caller set is kept). Two workers of two threads each on a 2-core
    machine made every parallel op of one wait for a core the other held: tests/models and tests/tasks took twice
    as long (experiments/results/test_suite_time.md, "Threads per worker"). Without workers the environment is
    left alone: Lightning then gives each DDP rank cores / ranks threads itself."""
    import torch

    threads = worker_threads(config)
    if hasattr(config, "workerinput"):
        threads = int(os.environ.setdefault("OMP_NUM_THREADS", str(threads)))
    torch.set_num_threads(threads)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e", action="store_true",
        help="run the end-to-end tier (runs of run.py, process groups, the experiments' one-batch forms) instead "
        "of the fast tier; tests/tiers.py decides which tier a test is in",
    )  # fmt: skip


def tier_reason(item: pytest.Item, cache: dict) -> str | None:
    """Why `item` is end-to-end (tests/tiers.py), from its test function and the tests package's fixtures it
    uses; None for the fast tier. Parametrized items of one function share the answer."""
    function = getattr(item, "function", None)
    if function is None:
        return None
    fixtures = tuple(
        definitions[-1].func
        for definitions in item._fixtureinfo.name2fixturedefs.values()
        if definitions and (definitions[-1].func.__module__ or "").startswith("tests")
    )
    key = (function, fixtures)
    if key not in cache:
        cache[key] = end_to_end_reason((function, *fixtures))
    return cache[key]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tier asked for (`--e2e`: the end-to-end tier, else the fast one), marking each end-to-end test
    `e2e` with its reason; then the files with the most end-to-end tests first, in-file order kept: pytest-xdist
    hands out whole files (--dist loadfile, pyproject.toml), so the long ones start at once and the short ones
    fill the gaps at the end instead of one long file running alone last."""
    cache: dict = {}
    keep, drop = [], []
    for item in items:
        reason = tier_reason(item, cache)
        if reason is not None:
            item.add_marker(pytest.mark.e2e(reason))
        (keep if (reason is not None) == config.getoption("--e2e") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    helpers.END_TO_END_ALLOWED = config.getoption("--e2e")
    weight = Counter(item.path for item in items if item.get_closest_marker(E2E))
    items.sort(key=lambda item: -weight[item.path])


@pytest.fixture
def tmp_outputs(tmp_path: Path) -> Path:
    """A fresh outputs/ root for a run started from the test (hydra.run.dir / paths.log_dir go here)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out
