"""Runs each test of a kernel folder under both settings of the fast-kernels switch (zoo/attention/fast/): the
reference path (public torch ops only) is tested as a first-class path, not only the CPU fast paths.

Imported by tests/attention/conftest.py and tests/nn/conftest.py. Two markers make a test run once, with the
switch on: `@pytest.mark.fast_path` for a test of a fast path itself (that it is taken, its memory, its
internals), `@pytest.mark.no_fast_path` for one that reaches no fast path (flex backend, random features, bias
tables, errors), where a second run would test the same code again.
"""

from __future__ import annotations

import pytest

from zoo.attention.fast import set_fast_kernels, use_fast_kernels


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast_path: tests a CPU fast path itself; runs with the switch on only")
    config.addinivalue_line("markers", "no_fast_path: reaches no CPU fast path; runs once, with the switch on")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fast_kernels" in metafunc.fixturenames:
        once = any(metafunc.definition.get_closest_marker(name) for name in ("fast_path", "no_fast_path"))
        settings = [True] if once else [True, False]
        ids = ["fast" if setting else "reference" for setting in settings]
        metafunc.parametrize("fast_kernels", settings, ids=ids, indirect=True)


@pytest.fixture(autouse=True)
def fast_kernels(request: pytest.FixtureRequest):
    """The switch as the test's parameter (on for tests outside the parametrisation), restored afterwards."""
    previous = use_fast_kernels()
    set_fast_kernels(getattr(request, "param", True))
    yield use_fast_kernels()
    set_fast_kernels(previous)
