"""Every test here runs with the fast-kernels switch on and off (tests/fast_kernels.py)."""

from tests.fast_kernels import fast_kernels, pytest_configure, pytest_generate_tests  # noqa: F401
