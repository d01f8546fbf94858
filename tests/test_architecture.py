"""docs/architecture.md stays true: its module lists are the files of zoo/, its path is the stack at trainer.fit,
and importing zoo registers nothing and keeps no run in module globals (issue 70)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_in_process

PAGE = ROOT / "docs" / "architecture.md"
ZOO = ROOT / "zoo"
# The calls that change the process for everyone: a module of zoo makes them only inside zoo.app.setup (or another
# function), never as it is imported.
PROCESS_SETUP = {"filterwarnings", "simplefilter", "register_new_resolver", "silence_banners", "seed_everything"}


def layer_rows() -> list[tuple[list[str], list[str]]]:
    """(the layers a row names, the modules it lists) for each row of the page's layer table."""
    rows = []
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`zoo."):
            rows.append((re.findall(r"`(zoo[\w.]*)`", cells[0]), [m.strip() for m in cells[2].split(",")]))
    return rows


def listed_modules() -> list[str]:
    modules = []
    for layers, names in layer_rows():
        package = layers[0] if len(layers) == 1 and (ROOT / layers[0].replace(".", "/")).is_dir() else "zoo"
        modules += [f"{package}.{name}" for name in names]
    return modules


def test_the_page_lists_every_module_of_zoo_once_in_its_layer() -> None:
    actual = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in ZOO.rglob("*.py")
        if path.name != "__init__.py"
    }
    listed = listed_modules()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert set(listed) == actual, (
        f"missing from docs/architecture.md: {sorted(actual - set(listed))}; "
        f"listed but gone: {sorted(set(listed) - actual)}"
    )


def test_the_layer_table_is_the_order_test_layers_checks() -> None:
    """Every layer of tests/test_layers.py is on the page, and what it may import is above it."""
    from tests.test_layers import ALLOWED

    order = [name.split(".")[1] for row, _ in layer_rows() for name in row]  # zoo.attention.fast -> attention
    assert set(order) == set(ALLOWED)
    for position, layer in enumerate(order):
        above = set(order[:position]) | {layer}
        assert ALLOWED[layer] <= above, f"{layer} may import {sorted(ALLOWED[layer] - above)}, below it on the page"


def test_no_module_changes_the_process_as_it_is_imported() -> None:
    """Warning filters, resolvers, seeds and logging filters are set by zoo.app.setup (or inside a function), not
    as a side effect of an import."""
    found = []
    for path in sorted(ZOO.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)] if not _is_definition(node) else []
            for call in calls:
                name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                if name in PROCESS_SETUP:
                    found.append(f"{path.relative_to(ROOT)}:{call.lineno} {name}")
    assert found == []


def _is_definition(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)


def test_the_app_keeps_no_run_in_module_globals() -> None:
    """No `global` statement and no module-level list, set or dict that a function fills in zoo/app/."""
    found = []
    for path in sorted((ZOO / "app").glob("*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            empty = isinstance(value, ast.List | ast.Set | ast.Dict) and not getattr(value, "elts", None)
            empty = empty and not getattr(value, "keys", None)
            if empty or (isinstance(value, ast.Call) and getattr(value.func, "id", "") in {"set", "list", "dict"}):
                found.append(f"{path.name}:{node.lineno} mutable module state")
    assert found == []


def test_every_family_has_its_task() -> None:
    from zoo.app.hints import model_families
    from zoo.export import FAMILIES

    assert [task.family for task in model_families()] == sorted(FAMILIES)


def test_the_page_draws_the_stack_at_trainer_fit(tmp_path: Path, monkeypatch, capsys) -> None:
    """run.py calls zoo.app.run and nothing else; from there Hydra calls zoo.app.job.run_job, which calls
    zoo.app.train.train, which calls trainer.fit: the functions of zoo on the stack when fit is called."""
    import lightning

    statements = ast.parse((ROOT / "run.py").read_text()).body
    main = [s for s in statements if isinstance(s, ast.If)]  # if __name__ == "__main__": run(sys.argv[1:])
    assert len(main) == 1 and [ast.unparse(s) for s in main[0].body] == ["run(sys.argv[1:])"]
    assert "from zoo.app import run" in [ast.unparse(s) for s in statements]

    seen: list[str] = []

    def fit(self, *args, **kwargs):
        frames = [f for f in inspect.stack() if Path(f.filename).resolve().is_relative_to(ZOO)]
        seen.extend(f"{Path(f.filename).relative_to(ZOO)}:{f.function}" for f in reversed(frames))
        raise KeyboardInterrupt  # stop here: the stack is what this test wants

    monkeypatch.setattr(lightning.Trainer, "fit", fit)
    with pytest.raises(KeyboardInterrupt):
        run_in_process(["model=vit", "print_config=false", "logger=none", f"paths.log_dir={tmp_path}"], capsys)
    assert seen == ["app/__init__.py:run", "app/__init__.py:job", "app/job.py:run_job", "app/train.py:train"]
    drawn = PAGE.read_text()
    steps = ["zoo.app.run(overrides)", "zoo.app.job.run_job(cfg, folders)", "zoo.app.train.train(cfg)", "trainer.fit("]
    assert [drawn.index(step) for step in steps] == sorted(drawn.index(step) for step in steps)
