"""The headline figures have one source, experiments/results/headline.json: README.md, the docs' results page and
RESULTS.md show exactly its rendering, and experiments/reproduce.py writes it into the RESULTS.md it makes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments import headline, reproduce
from tests.helpers import ROOT


def test_every_page_shows_the_headline_of_the_one_source() -> None:
    stale = [str(page.relative_to(ROOT)) for page in headline.stale()]
    assert not stale, f"headline differs from experiments/results/headline.json: {stale}; run experiments/headline.py"


def test_a_figure_edited_by_hand_on_a_page_is_found(tmp_path: Path) -> None:
    pages = {}
    for page, details in headline.PAGES.items():
        copy = tmp_path / page.name.replace(".md", f"-{len(pages)}.md")
        shutil.copy(page, copy)
        pages[copy] = details
    readme = next(iter(pages))
    assert headline.stale(pages) == []
    readme.write_text(readme.read_text().replace("**0.9286**", "**0.93**", 1))
    assert headline.stale(pages) == [readme]
    assert headline.main(["--check"]) == 0  # the repository's own pages are untouched


def test_the_rendering_follows_the_source_and_only_the_details_column_differs(tmp_path: Path) -> None:
    source = tmp_path / "headline.json"
    source.write_text(json.dumps({"rows": [{"figure": "f", "measured": "1.5x", "target": ">= 1x", "details": "d"}]}))
    assert headline.table(False, source).splitlines()[2] == "| f | **1.5x** | >= 1x |"
    assert headline.table(True, source).splitlines()[2] == "| f | **1.5x** | >= 1x | d |"
    page = f"# p\n\n{headline.BEGIN}\n\nold table\n\n{headline.END}\n\nafter\n"
    assert headline.rendered(page, False, source) == f"# p\n\n{headline.block(False, source)}\n\nafter\n"
    with pytest.raises(ValueError, match="headline markers"):
        headline.rendered("# a page without markers\n", False, source)


def test_the_current_figures_are_the_recipes_of_fashion_mnist() -> None:
    """#46: RESULTS.md's headline showed the patch stem's 0.865 and 0.888, the README the recipes' 0.9286 and 0.9039."""
    rows = {row["figure"]: row["measured"] for row in headline.rows()}
    assert rows["ViT, Fashion-MNIST, test accuracy"] == "0.9286"
    assert rows["CLIP, Fashion-MNIST zero-shot top-1"] == "0.9039"
    results = (ROOT / "experiments" / "results" / "RESULTS.md").read_text()
    shown = results.split(headline.BEGIN)[1].split(headline.END)[0]
    assert "| **0.9286** |" in shown and "| **0.865** |" not in shown and "| **0.888** |" not in shown


def test_reproduce_writes_the_headline_from_the_source(tmp_path: Path) -> None:
    args = reproduce.parse_args(["--out", str(tmp_path)])
    path = reproduce.write_results(args, {"CPU": "test CPU"}, [], ("", ["| k | 2.000x | >= 1x |"]), ("", []), tmp_path)
    text = path.read_text()
    assert headline.block(details=True) in text.split("## Figures of this run")[0]
    assert "| k | 2.000x | >= 1x |" in text.split("## Figures of this run")[1]  # this run's figures stay beside it
    assert headline.rendered(text, True) == text
