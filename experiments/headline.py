"""The headline figures, from their one source (experiments/results/headline.json) into every page that shows them.

    python experiments/headline.py            # render the tables into README.md, docs/results.md and RESULTS.md
    python experiments/headline.py --check    # exit 1 naming the pages whose table differs from the source

Each page holds its table between two HTML comments (BEGIN and END below), so an edit by hand between them is
overwritten by the next render and fails tests/test_headline.py until then. README.md shows figure, measured and
target; the docs results page and RESULTS.md add where and when each figure was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "experiments" / "results" / "headline.json"
BEGIN = "<!-- headline: rendered from experiments/results/headline.json by `python experiments/headline.py` -->"
END = "<!-- headline end -->"
PAGES = {  # page -> whether its table carries the details column
    ROOT / "README.md": False,
    ROOT / "docs" / "results.md": True,
    ROOT / "experiments" / "results" / "RESULTS.md": True,
}


def rows(source: Path = SOURCE) -> list[dict[str, str]]:
    return json.loads(source.read_text())["rows"]


def table(details: bool, source: Path = SOURCE) -> str:
    """The headline table in Markdown, with or without the column saying where and when each figure was measured."""
    header = ["figure", "measured", "target or published anchor"] + ["measured on, how"] * details
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows(source):
        cells = [row["figure"], f"**{row['measured']}**", row["target"]] + [row["details"]] * details
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block(details: bool, source: Path = SOURCE) -> str:
    """The table between its markers, as it stands in a page."""
    return f"{BEGIN}\n\n{table(details, source)}\n\n{END}"


def rendered(text: str, details: bool, source: Path = SOURCE) -> str:
    """The page's text with its headline block replaced by the current rendering."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"a page must hold the headline markers once each: {BEGIN!r} ... {END!r}")
    before, rest = text.split(BEGIN)
    return before + block(details, source) + rest.split(END, 1)[1]


def stale(pages: dict[Path, bool] = PAGES, source: Path = SOURCE) -> list[Path]:
    """The pages whose headline table differs from the source."""
    return [page for page, details in pages.items() if rendered(page.read_text(), details, source) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which pages differ from the source")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for page in bad:
            print(f"{page.relative_to(ROOT)}: headline differs from {SOURCE.relative_to(ROOT)}", file=sys.stderr)
        return 1 if bad else 0
    for page, details in PAGES.items():
        page.write_text(rendered(page.read_text(), details))
        print(f"rendered {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
