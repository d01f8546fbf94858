"""The two tiers of the suite, decided by what a test does, not by a hand-kept list.

A test is end-to-end (the `e2e` tier, `python -m pytest -q --e2e`) when its code, a fixture it uses, or a helper
of the tests package that either calls reaches one of:
- a run of zoo's command line: `zoo.app.run`, or the helpers `run_cli`, `start` (a new interpreter),
  `run_in_process` (zoo.app.run);
- a new process or process group: `subprocess`, `multiprocessing` / `torch.multiprocessing`, `runpy`, `os.fork`;
- a benchmark or study of experiments/: `run_benchmark`, or `main` / `run` of a script of experiments/ (imported as
  `experiments.x`, or as `x` with the folder on sys.path).
Everything else is the fast tier, the README's `python -m pytest -q`. The reading is static (names in the code
objects, resolved in the module that holds them), as lightning-hydra-template splits `test` from `test-full`
by marker, except that here the marker is derived; tests/test_suite_settings.py checks the rule on examples,
and in the fast tier the run helpers refuse to start (tests/helpers.py), so a test the rule missed fails there
instead of slowing the tier.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path

E2E = "e2e"
# Helpers of tests/helpers.py that run zoo end to end or an experiment, by name.
RUN_HELPERS = frozenset({"run_cli", "start", "run_in_process", "run_benchmark"})
PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "torch.multiprocessing", "runpy"})
BENCHMARK_ENTRIES = frozenset({"main", "run"})  # the entry points of experiments/*.py


def _code_objects(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _is_experiment(module: types.ModuleType | None) -> bool:
    """A script of experiments/, imported as `experiments.x` or, with the folder on sys.path, as `x`."""
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().parent == EXPERIMENTS


def _in_tests(obj: object) -> bool:
    """A function or class of the tests package (its helpers, a test module's own, a conftest's)."""
    return (inspect.isfunction(obj) or inspect.isclass(obj)) and (obj.__module__ or "").split(".")[0] == "tests"


def _callees(obj: object) -> list[Callable]:
    """The functions to read next: the function itself, or every method a class of the tests package defines."""
    if inspect.isclass(obj):
        return [m for m in vars(obj).values() if inspect.isfunction(m)]
    return [obj]


def end_to_end_reason(functions: Iterable[Callable]) -> str | None:
    """Why these functions (a test and its fixtures) are end-to-end, or None: the first run, process or
    benchmark their code reaches, following the tests package's own helpers they call."""
    seen: set[types.CodeType] = set()
    stack = [inspect.unwrap(f) for f in functions if hasattr(inspect.unwrap(f), "__code__")]
    while stack:
        function = stack.pop()
        scope = function.__globals__
        for code in _code_objects(function.__code__):
            if code in seen:
                continue
            seen.add(code)
            names = set(code.co_names)
            # what the function imports itself (`from tests.helpers import run_cli`, `import subprocess`)
            if names & PROCESS_MODULES:
                return f"starts a process ({sorted(names & PROCESS_MODULES)[0]})"
            if "tests.helpers" in names and names & RUN_HELPERS:
                return f"runs zoo end to end ({sorted(names & RUN_HELPERS)[0]})"
            if "zoo.app" in names and "run" in names:  # `from zoo.app import run`
                return "runs zoo end to end (zoo.app.run)"
            if any(name.split(".")[0] == "experiments" for name in names) and names & BENCHMARK_ENTRIES:
                return "runs a benchmark (experiments)"
            for name in names:
                obj = scope.get(name)
                if obj is None:
                    continue
                if isinstance(obj, types.ModuleType):
                    if obj.__name__ == "tests.helpers" and names & RUN_HELPERS:  # helpers.run_cli(...)
                        return f"runs zoo end to end ({sorted(names & RUN_HELPERS)[0]})"
                    if obj.__name__ in PROCESS_MODULES:
                        return f"starts a process ({obj.__name__})"
                    if obj.__name__ in ("zoo", "zoo.app") and "run" in names and "app" in names | {obj.__name__[4:]}:
                        return "runs zoo end to end (zoo.app.run)"  # zoo.app.run(...), app.run(...)
                    if obj.__name__ == "os" and "fork" in names:
                        return "starts a process (os.fork)"
                    if _is_experiment(obj) and names & BENCHMARK_ENTRIES:
                        return f"runs a benchmark ({obj.__name__})"
                elif inspect.isfunction(obj) and (obj.__module__, obj.__name__) == ("zoo.app", "run"):
                    return "runs zoo end to end (zoo.app.run)"
                elif inspect.isfunction(obj) and obj.__module__ == "tests.helpers" and obj.__name__ in RUN_HELPERS:
                    return f"runs zoo end to end ({obj.__name__})"
                elif inspect.isfunction(obj) and _is_experiment(sys.modules.get(obj.__module__)):
                    if obj.__name__ in BENCHMARK_ENTRIES:
                        return f"runs a benchmark ({obj.__module__}.{obj.__name__})"
                elif getattr(obj, "__module__", None) in PROCESS_MODULES:
                    return f"starts a process ({obj.__module__}.{getattr(obj, '__name__', name)})"
                elif _in_tests(obj):
                    stack.extend(_callees(obj))
    return None
