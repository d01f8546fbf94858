"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
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


# -- the trained runs the end-to-end tests share ------------------------------------------------------------
QUIET_RUN = [
    "print_config=false",
    "logger=csv",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
]
TRAINED = {
    # the README's example run: the main job's model (its docs resume it as is), one batch, no test
    "vit_example": ["model=vit", "trainer.max_epochs=1", "+trainer.limit_train_batches=1",
                    "trainer.limit_val_batches=1", "test=false"],
    # small models trained for two batches, whose checkpoints the inference modes read
    "vit_small": ["model=vit", "model.net.dim=16", "model.net.depth=2", "model.net.num_heads=2",
                  "model.net.mlp_dim=32", "trainer.max_epochs=1", "+trainer.limit_train_batches=2",
                  "trainer.limit_val_batches=1", "test=false"],
    "clip_small": ["model=clip", "model.net.embed_dim=16", "model.net.image.dim=16", "model.net.image.depth=1",
                   "model.net.image.num_heads=2", "model.net.image.mlp_dim=32", "model.net.text.dim=16",
                   "model.net.text.depth=1", "model.net.text.num_heads=2", "model.net.text.mlp_dim=32",
                   "trainer.max_epochs=1", "+trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                   "test=false"],
    # the error tests' earlier runs, that no bad input may harm: a tiny ViT with its test, a tiny GPT on CORPUS
    "vit_tiny": ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
                 "trainer.max_epochs=1", "+trainer.limit_train_batches=1", "trainer.limit_val_batches=1",
                 "trainer.limit_test_batches=1"],
    "gpt_tiny": ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
                 "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4", "data=text",
                 "data.path={corpus}", "trainer.max_steps=2", "trainer.val_check_interval=2", "test=false"],
}  # fmt: skip
CORPUS = "To be, or not to be, that is the question.\n" * 40  # the GPT run's corpus


@dataclass
class TrainedRun:
    folder: Path  # the run folder (checkpoints/, examples/, csv/ ...): read it, copy it to change it
    stdout: str  # what the run printed

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoints" / "last.ckpt"

    def copy_to(self, folder: Path) -> Path:
        """A copy of the run folder at `folder`, for a test that changes or resumes it."""
        shutil.copytree(self.folder, folder)
        return folder


class TrainedRuns:
    """The runs of TRAINED, each trained through run.py the first time a test asks for it and kept for the
    session (per pytest-xdist worker): the README, mode and error tests share them instead of training their own."""

    def __init__(self, root: Path) -> None:
        self.root, self.runs = root, {}

    def __getitem__(self, name: str) -> TrainedRun:
        if name not in self.runs:
            folder, corpus = self.root / name, self.root / "corpus.txt"
            corpus.write_text(CORPUS)
            args = [arg.format(corpus=corpus) for arg in TRAINED[name]]
            code, out, err = helpers.run_in_process([*args, *QUIET_RUN, f"hydra.run.dir={folder}"])
            assert code == 0, (out + err)[-3000:]
            self.runs[name] = TrainedRun(folder, out)
        return self.runs[name]


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """The shared trained runs (TRAINED), made on first use."""
    return TrainedRuns(tmp_path_factory.mktemp("trained"))


@pytest.fixture
def tmp_outputs(tmp_path: Path) -> Path:
    """A fresh outputs/ root for a run started from the test (hydra.run.dir / paths.log_dir go here)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out
