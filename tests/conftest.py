"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest


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
