"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with the most end-to-end (`slow`) tests first, in-file order kept: pytest-xdist hands out whole
    files (--dist loadfile, pyproject.toml), so the long ones start at once and the short ones fill the gaps at
    the end instead of one long file running alone last."""
    weight = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -weight[item.path])


@pytest.fixture
def tmp_outputs(tmp_path: Path) -> Path:
    """A fresh outputs/ root for a run started from the test (hydra.run.dir / paths.log_dir go here)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out
