"""The statistics of the variant study's page: seeds a cell needs, a bootstrap interval of its median, and which row
of a column wins, ties with the best or falls behind. Pure functions of numbers (no torch, no files).

The rule (issue 53): a column names a winner only when the best row's 95% interval excludes every other row's
median; otherwise the rows whose intervals overlap the best's are tied with it ("≈ best"), and the column has no
clear winner. A row with fewer than MIN_SEEDS_TO_WIN values has no interval worth the name: it can tie, never win.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

LEVEL = 0.95  # the interval's coverage
RESAMPLES = 2000  # bootstrap resamples per cell: the interval's ends move by less than the shown digits beyond this
SHORT_JOB_S = 120.0  # a job shorter than this gets FEW_SEEDS_SHORT seeds, a longer one FEW_SEEDS_LONG (issue 53)
SEEDS_SHORT, SEEDS_LONG = 5, 3
MIN_SEEDS_TO_WIN = 3


def seeds_required(wall_s: float | None) -> int:
    """Seeds a cell needs: 5 where one job takes under 2 minutes, else 3 (an unknown time: the long job's 3)."""
    return SEEDS_SHORT if wall_s is not None and wall_s < SHORT_JOB_S else SEEDS_LONG


def bootstrap_interval(values: list[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):
    """Percentile bootstrap interval of the median over `values` (seeds), as (low, high); None for fewer than 2.
    With 3-5 seeds the resampled medians can only take the seeds' own values: the interval is close to their
    range, which is what 3-5 seeds can say."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    low = medians[int(tail * resamples)]
    high = medians[min(resamples - 1, int((1 - tail) * resamples))]
    return low, high


@dataclass(frozen=True)
class Cell:
    """One row's numbers in one column: the median and its interval (None with fewer than 2 values)."""

    median: float
    low: float | None = None
    high: float | None = None
    n: int = 1

    @classmethod
    def of(cls, values: list[float]) -> Cell:
        interval = bootstrap_interval(values)
        low, high = interval if interval else (None, None)
        return cls(statistics.median(values), low, high, len(values))

    def span(self) -> tuple[float, float]:
        """The interval, or the single value as a point when there is none."""
        return (self.low, self.high) if self.low is not None else (self.median, self.median)


def verdict(cells: dict[str, Cell], higher_is_better: bool) -> dict:
    """{"winner": name or None, "best": the row with the best median, "marks": {row: "winner" | "best" | "≈ best" |
    ""}} for one column. The best row wins only if it has an interval (MIN_SEEDS_TO_WIN values or more) that excludes
    every other row's median; else it is "best" (no clear winner), and every row whose interval overlaps the best's
    (or whose median lies inside it) is "≈ best" (every row, when the best has too few seeds for an interval). The
    rest are behind ("")."""
    if not cells:
        return {"winner": None, "best": None, "marks": {}}
    sign = 1 if higher_is_better else -1
    best = max(cells, key=lambda name: sign * cells[name].median)
    low, high = cells[best].span()
    others = {name: cell for name, cell in cells.items() if name != best}
    inside = {name for name, cell in others.items() if low <= cell.median <= high}
    overlapping = {name for name, cell in others.items() if cell.span()[0] <= high and cell.span()[1] >= low}
    measured = cells[best].n >= MIN_SEEDS_TO_WIN and cells[best].low is not None
    clear = measured and not inside and bool(others)  # a row alone in its column wins nothing
    # A best without an interval (too few seeds) says nothing about how far the others are: none falls behind it.
    tied = set() if clear else (inside | overlapping if measured else set(others))
    marks = {name: ("≈ best" if name in tied else "") for name in others}
    marks[best] = "winner" if clear else "best"
    return {"winner": best if clear else None, "best": best, "marks": marks}
