"""Results pages state what is measured, the command, the conditions and the figures; which work session ("sitting")
ran what belongs in the commit messages, not on a page (issue 70)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

RESULTS = ROOT / "experiments" / "results"
# Real uses of the word, not a work session: the German example's reference translation.
ALLOWED = ("People are sitting on a train",)
SITTING = re.compile(r"\bsittings?\b", re.IGNORECASE)


def results_pages() -> list[Path]:
    """Every markdown page under experiments/results/ and the docs' results page."""
    pages = sorted(RESULTS.rglob("*.md"))
    return [*pages, ROOT / "docs" / "results.md"]


def sittings_named(page: Path) -> list[str]:
    """The lines of a page that name a work session, the allowed phrases left out."""
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for phrase in ALLOWED:
            line = line.replace(phrase, "")
        if SITTING.search(line):
            found.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    return found


def test_results_pages_name_no_work_session() -> None:
    named = [line for page in results_pages() for line in sittings_named(page)]
    assert not named, (
        "a results page names a sitting; state the date, host and load (the story goes in the commit message):\n"
        + ("\n".join(named))
    )


def test_the_allowed_phrase_is_still_on_its_page() -> None:
    """The allow-list holds real uses only: the German example's reference stays on the translation page."""
    assert ALLOWED[0] in (RESULTS / "translation_multi30k.md").read_text()
