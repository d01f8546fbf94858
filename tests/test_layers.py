"""zoo/ is layered: imports only point down (attention -> nn -> models; data; training; tasks; app), nothing
imports upward, not even inside a function, and there is no import cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

ZOO = ROOT / "zoo"
# What each layer may import from zoo (besides itself). Leaves: errors (types and checks), weights (the reader),
# hardware (what the processors do natively).
ALLOWED = {
    "errors": set(),
    "weights": {"errors"},
    "hardware": set(),
    "attention": {"errors"},
    "nn": {"errors", "attention"},
    "models": {"errors", "weights", "hardware", "attention", "nn"},
    "data": {"errors"},
    "training": {"errors", "weights", "hardware"},
    "tasks": {"errors", "weights", "hardware", "attention", "nn", "models", "data", "training"},
    # export: zoo.load, pure torch, no Lightning
    "export": {"errors", "weights", "hardware", "attention", "nn", "models", "data"},
    "explain": {"errors", "attention", "nn", "models"},  # attribution math on the models: usable from a notebook
    "app": {
        "errors",
        "weights",
        "hardware",
        "attention",
        "nn",
        "models",
        "data",
        "training",
        "tasks",
        "export",
        "explain",
    },
}


def layer_of(module: str) -> str:
    return module.split(".")[1]


def zoo_imports(path: Path) -> set[str]:
    """Every zoo module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("zoo.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zoo.") and not node.level:
            found.add(node.module)
    return found


def modules() -> dict[str, Path]:
    out = {}
    for path in ZOO.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if len(parts) > 1:
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@pytest.mark.parametrize("module", sorted(m for m in modules() if m != "zoo"))
def test_imports_point_down_the_layers(module: str) -> None:
    layer = layer_of(module)
    assert layer in ALLOWED, f"{module}: zoo/{layer} is not a known layer; add it to ALLOWED with what it may import"
    upward = sorted(i for i in zoo_imports(modules()[module]) if layer_of(i) not in ALLOWED[layer] | {layer})
    assert not upward, f"{module} ({layer}) imports {upward}; {layer} may import {sorted(ALLOWED[layer])}"


def test_there_is_no_import_cycle() -> None:
    graph = {name: {i for i in zoo_imports(path) if i in modules() and i != name} for name, path in modules().items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in graph[node]:
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_importing_a_task_does_not_load_the_command_line_layer() -> None:
    code = "import sys, zoo.tasks.language_model; print(sorted(m for m in sys.modules if m.startswith('zoo.app')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_torch_load_is_called_in_one_place() -> None:
    calls = [str(p.relative_to(ROOT)) for p in ZOO.rglob("*.py") if "torch.load(" in p.read_text()]
    assert calls == ["zoo/weights.py"]
