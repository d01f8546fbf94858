"""What the fault tests share: a tiny deterministic ViT run, started as a real process, and its uninterrupted
reference (the metrics every resumed run must reproduce)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import finish, start
from zoo.training.throughput import MEASURED

# 4 epochs of 5 batches, validated after each: last.ckpt at steps 5, 10, 15, 20.
TINY_VIT = [
    "model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
    "model.optimizer.lr=1e-2", "trainer.max_epochs=4", "+trainer.limit_train_batches=5",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "trainer.deterministic=true",
    "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null", "callbacks.lr_monitor=null",
    "+trainer.enable_progress_bar=false", "print_config=false",
]  # fmt: skip


def fault(name: str, marker: Path, **options) -> list[str]:
    """Overrides adding the test-only callback tests.faults.injection.<name> (it fires once: see its marker)."""
    extra = [f"+callbacks.fault.{key}={value}" for key, value in options.items()]
    return [f"+callbacks.fault._target_=tests.faults.injection.{name}", f"+callbacks.fault.marker={marker}", *extra]


def run(args: list[str], env: dict | None = None, timeout: float = 420) -> tuple[int, str, str, float]:
    """Run to the end: (exit status, stdout, stderr, seconds)."""
    began = time.monotonic()
    code, out, err = finish(start(args, env), timeout)
    return code, out, err, time.monotonic() - began


def only_run_dir(log_dir: Path, task: str = "vit") -> Path:
    runs = [p for p in (log_dir / task).iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run directory, found {runs}"
    return runs[0]


def metrics_of(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "metrics.json").read_text())


def assert_same_metrics(resumed: dict[str, float], expected: dict[str, float]) -> None:
    assert resumed.keys() == expected.keys() and "test/acc" in resumed
    for key, value in expected.items():
        if key not in MEASURED:  # speeds are measurements of the machine, not of the run
            assert resumed[key] == pytest.approx(value, abs=1e-6), key


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run: its metrics, what it printed, and its run directory (copy it before changing it)."""
    log_dir = tmp_path_factory.mktemp("reference")
    code, out, err, _ = run([*TINY_VIT, "logger=csv", f"paths.log_dir={log_dir}"])
    assert code == 0, err[-3000:]
    run_dir = only_run_dir(log_dir)
    return {"metrics": metrics_of(run_dir), "out": out, "err": err, "run_dir": run_dir}


@pytest.fixture(scope="session")
def reference(reference_run: dict) -> dict[str, float]:
    """The uninterrupted run's metrics."""
    return reference_run["metrics"]
