"""The docs site and the README as a front door: every page is in the site's nav, the README stays short, and every
`python experiments/...` command a page shows parses with its script's own command line (the run.py commands are
run by tests/test_readme.py). Pages added later are read as well."""

from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from tests.test_readme import DOCS, ENVIRONMENT, README, code_blocks, pages, strip_comment

# Scripts that need hardware this machine lacks: their commands are checked to name an existing script only.
HARDWARE_SCRIPTS = {"experiments/gpu_check.py": "a GPU"}


def experiment_commands(text: str) -> list[list[str]]:
    """`python experiments/<script>.py ...` commands of a page's code blocks and inline code, as argument lists."""
    found = []
    lines = [line for block in code_blocks(text) for line in block]
    spans = re.findall(r"(?<!`)`((?:[A-Z_][A-Z0-9_]*=\S* )*python experiments/[^`]*)`", text)
    lines += [" ".join(span.split()) for span in spans]
    for line in lines:
        if "python experiments/" not in line:  # other lines of a block (Python code, output) are no commands
            continue
        words = shlex.split(strip_comment(line.strip().removeprefix("$ ")))
        while words and ENVIRONMENT.match(words[0]):  # `ZOO_FAST_KERNELS=0 python experiments/...`: the command
            words.pop(0)
        if words[:1] == ["python"] and len(words) > 1 and words[1].startswith("experiments/"):
            found.append(words[1:])
    return found


def commands() -> list[tuple[str, list[str]]]:
    """(page, [script, *arguments]) of every page, each distinct command once."""
    found: dict[tuple[str, ...], str] = {}
    for page in pages():
        for words in experiment_commands(page.read_text()):
            found.setdefault(tuple(words), str(page.relative_to(ROOT)))
    return [(page, list(words)) for words, page in found.items()]


COMMANDS = commands()


class Parsed(Exception):
    """Raised in place of running the experiment, once its command line has parsed."""


def parse_only(script: Path, arguments: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The script's own argparse result for these arguments, without running the experiment: its parser's
    parse_known_args returns into an exception (unknown arguments are an error, as parse_args makes them)."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = original(self, args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise Parsed(parsed)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    monkeypatch.setattr(sys, "argv", [str(script), *arguments])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Parsed as done:
        return done.args[0]
    raise AssertionError(f"{script.name} ran to its end without parsing a command line")


def test_the_pages_show_the_experiment_commands_this_test_reads() -> None:
    scripts = {words[0] for _, words in COMMANDS}
    assert {"experiments/reproduce.py", "experiments/variant_study.py", "experiments/gpu_check.py"} <= scripts
    assert ["experiments/reproduce.py", "--quick"] in [words for _, words in COMMANDS]


@pytest.mark.parametrize("page, words", [pytest.param(p, w, id=f"{p}: {' '.join(w)}") for p, w in COMMANDS])
def test_experiment_command_parses_as_written(page: str, words: list[str], monkeypatch, capsys) -> None:
    script, arguments = ROOT / words[0], words[1:]
    assert script.is_file(), f"{page} shows a script that does not exist: {words[0]}"
    if words[0] in HARDWARE_SCRIPTS:  # cannot run here: it must at least compile
        compile(script.read_text(), str(script), "exec")
        return
    try:
        parse_only(script, arguments, monkeypatch)
    except SystemExit as exit_:  # argparse's error: a flag or value the script does not take
        raise AssertionError(f"{page}: `python {' '.join(words)}` does not parse: {capsys.readouterr().err}") from exit_
    # Each experiment script a page names has its own test that runs it scaled down (tests/test_<script>.py).
    assert (ROOT / "tests" / f"test_{script.stem}.py").is_file(), f"no tests/test_{script.stem}.py runs {words[0]}"


def nav_pages(nav: list) -> set[str]:
    found = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            found |= nav_pages(value) if isinstance(value, list) else {value}
    return found


def test_every_docs_page_is_in_the_site_nav() -> None:
    """Adding a page is one file in docs/ and one line in mkdocs.yml's nav; this test names a missing line."""
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert on_disk - nav == set(), f"pages missing from the nav of mkdocs.yml: {sorted(on_disk - nav)}"
    assert nav - on_disk == set(), f"nav entries of mkdocs.yml without a page in docs/: {sorted(nav - on_disk)}"


def test_the_readme_is_a_short_front_door_that_links_into_the_docs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([^)#]+)", text))
    assert {"getting-started.md", "results.md", "extending.md"} <= linked
    assert all((DOCS / page).is_file() for page in linked), linked


def model_rows(page: Path) -> dict[str, list[str]]:
    """The rows of a page's table of models (`model=`), by model: the cells after the first."""
    rows = re.findall(r"^\| `(\w+)` \|(.*)\|$", page.read_text(), re.M)
    return {model: [cell.strip() for cell in cells.split("|")] for model, cells in rows}


def test_the_tables_of_models_agree_on_every_page() -> None:
    """The README's models x data x attention x trainers table is repeated on the docs' getting-started page and,
    its attention column, on the attention menu: the copies must not drift apart."""
    readme = model_rows(README)
    assert set(readme) == {path.stem for path in (ROOT / "conf" / "model").glob("*.yaml")}  # every model= option
    assert model_rows(DOCS / "getting-started.md") == readme
    assert model_rows(DOCS / "attention.md") == {model: [cells[1]] for model, cells in readme.items()}


def test_every_extra_the_pages_and_ci_install_is_declared():
    """`pip install -e '.[docs]'` in a page or in .ci/run names extras pyproject.toml declares: a missing extra only
    warns in pip, and CI then fails later on a command the extra should have brought (`mkdocs: command not found`)."""
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    texts = {path.relative_to(ROOT): path.read_text() for path in [ROOT / ".ci" / "run", README, *pages()]}
    named = {
        (where, extra)
        for where, text in texts.items()
        for group in re.findall(r"\.\[([\w,-]+)\]", text)
        for extra in group.split(",")
    }
    assert {(".ci/run", "docs"), ("README.md", "docs")} <= {(str(where), extra) for where, extra in named}
    missing = sorted(f"{where}: .[{extra}]" for where, extra in named if extra not in declared)
    assert not missing, f"extras not in pyproject.toml's optional-dependencies {sorted(declared)}: {missing}"


def test_the_home_page_points_to_every_page_of_the_site() -> None:
    """docs/index.md's "Where to go" table is how a reader finds a page: a page added to the nav is linked there."""
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    linked = set(re.findall(r"\]\(([^)#]+\.md)", (DOCS / "index.md").read_text()))
    unlinked = sorted(page for page in nav - linked - {"index.md"} if not page.startswith("reference/"))
    assert not unlinked, f"pages of the nav without a row in docs/index.md's table: {unlinked}"


# -- the API reference (docs/reference/) ---------------------------------------------------------------------------
REFERENCE = DOCS / "reference"


@pytest.fixture(scope="module")
def package():
    """zoo as mkdocstrings reads it: griffe's static view, docstrings parsed as the site parses them (Google)."""
    griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra: pip install -e '.[docs]'")
    return griffe.load("zoo", search_paths=[str(ROOT)], docstring_parser="google")


def rendered(package, member) -> bool:
    """Whether mkdocstrings shows this member of a page's module: public, and with a docstring of its own or of a
    member (the site's default hides an object without any)."""
    if not member.is_public:
        return False
    target = member.final_target if member.is_alias else member
    return bool(target.docstring) or any(m.docstring for m in target.members.values() if not m.is_alias)


def reference_paths(package) -> set[str]:
    """The canonical paths (module.Name) of the objects the reference pages render: a `::: zoo.module` directive
    renders the module's public members (a package's: its __all__), `::: zoo.module.Name` the object."""
    paths = set()
    for page in REFERENCE.glob("*.md"):
        for target in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M):
            obj = package if target == "zoo" else package[target.removeprefix("zoo.")]
            members = obj.members.values() if obj.is_module else [obj]
            paths |= {m.final_target.path if m.is_alias else m.path for m in members if rendered(package, m)}
    return paths


def reference_subjects() -> dict[str, type]:
    """What the reference must show: every registered kernel, and every model family's network and config."""
    from zoo.attention.registry import VARIANTS
    from zoo.export import FAMILIES

    subjects = {f"attention={name}": kernel for name, kernel in VARIANTS.items()}
    for family, (network, config) in FAMILIES.items():
        subjects |= {f"model={family}": network, f"model={family} config": config}
    return subjects


def test_the_api_reference_shows_every_kernel_and_every_model_family(package) -> None:
    """A kernel added to zoo.attention.registry.VARIANTS or a family added to zoo.export.FAMILIES (the families of
    conf/model/*.yaml: test_one_list_of_model_families) appears in docs/reference/ by a `:::` directive."""
    shown = reference_paths(package)
    missing = sorted(
        f"{what}: {cls.__module__}.{cls.__qualname__}"
        for what, cls in reference_subjects().items()
        if f"{cls.__module__}.{cls.__qualname__}" not in shown
    )
    assert not missing, f"not rendered by docs/reference/*.md (no `:::` directive, or no docstring): {missing}"


def parameter_names(obj) -> list[str]:
    """A dataclass's init fields, a kernel's options, a function's parameters (*args and **kwargs aside)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(obj):
        return [field.name for field in dataclasses.fields(obj) if field.init]
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.name != "self" and p.kind not in skip]


def args_subjects() -> dict[str, object]:
    """The classes and functions whose parameters the reference shows in an Args section: the kernels, the model
    configs (nested ones too), zoo.load and the export functions."""
    from zoo import export
    from zoo.models.clip import TextTransformerConfig
    from zoo.models.gpt import SamplingConfig

    subjects = {f"{cls.__module__}.{cls.__qualname__}": cls for what, cls in reference_subjects().items()}
    subjects = {path: cls for path, cls in subjects.items() if "attention" in path or path.endswith("Config")}
    for obj in (TextTransformerConfig, SamplingConfig):
        subjects[f"{obj.__module__}.{obj.__qualname__}"] = obj
    for function in (export.load, export.save_folder, export.export_onnx, export.export_huggingface):
        subjects[f"zoo.export.{function.__name__}"] = function
    return subjects


@pytest.mark.parametrize("path, obj", list(args_subjects().items()), ids=list(args_subjects()))
def test_the_reference_renders_every_parameter_in_an_args_section(package, path: str, obj) -> None:
    """Google-style `Args:` one line each (as timm), parsed as the site parses it: prose about parameters renders
    as prose, so a parameter missing from the section is missing from the page's table of parameters."""
    docstring = package[path.removeprefix("zoo.")].docstring
    sections = docstring.parsed if docstring else []
    documented = {p.name for s in sections if s.kind.value == "parameters" for p in s.value}
    missing = [name for name in parameter_names(obj) if name not in documented]
    assert not missing, f"{path}'s docstring has no Args line for {missing}"


# -- one list of model families --------------------------------------------------------------------------------------
NUMBER_WORDS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
COUNTS = {word: count for count, word in enumerate(NUMBER_WORDS, start=2)}


def yaml_families() -> dict[str, str]:
    """model= option -> the family its task trains (`model._target_`'s `family`); a preset without a task of its
    own (llama) takes it from the option it builds on (its `defaults`)."""
    import importlib

    def family(option: str) -> str:
        config = yaml.safe_load((ROOT / "conf" / "model" / f"{option}.yaml").read_text())
        target = (config.get("model") or {}).get("_target_")
        if target is None:
            (base,) = [entry for entry in config["defaults"] if isinstance(entry, str) and entry != "_self_"]
            return family(base)
        module, name = target.rsplit(".", 1)
        return getattr(importlib.import_module(module), name).family

    return {path.stem: family(path.stem) for path in sorted((ROOT / "conf" / "model").glob("*.yaml"))}


def test_one_list_of_model_families() -> None:
    """zoo.export.FAMILIES is the list (conf/model/*.yaml train exactly its families; llama is GPT's preset), and
    a text that counts the families says its length: pyproject's description and the README always do."""
    import tomllib

    import zoo
    import zoo.models
    from zoo.export import FAMILIES

    assert set(yaml_families().values()) == set(FAMILIES), yaml_families()
    texts = {
        "pyproject.toml": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"],
        "README.md": README.read_text(),
        "zoo/__init__.py": zoo.__doc__,
        "zoo/models/__init__.py": zoo.models.__doc__,
        **{str(page.relative_to(ROOT)): page.read_text() for page in pages()},
    }
    pattern = rf"\b({'|'.join(COUNTS)}) (?:model )?families\b"
    counts = {where: [COUNTS[w.lower()] for w in re.findall(pattern, text, re.I)] for where, text in texts.items()}
    wrong = {where: found for where, found in counts.items() if any(n != len(FAMILIES) for n in found)}
    assert not wrong, f"{len(FAMILIES)} families (zoo.export.FAMILIES: {list(FAMILIES)}), but {wrong}"
    assert counts["pyproject.toml"] and counts["README.md"], counts
