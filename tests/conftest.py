"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tmp_outputs(tmp_path: Path) -> Path:
    """A fresh outputs/ root for a run started from the test (hydra.run.dir / paths.log_dir go here)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out
