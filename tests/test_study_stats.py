"""experiments/study_stats.py: the seeds a cell needs, the bootstrap interval of a median and the winner rule of the
variant study's page, on hand-made records."""

from __future__ import annotations

import statistics

from experiments.study_stats import Cell, bootstrap_interval, seeds_required, verdict


def test_short_jobs_need_five_seeds_and_long_ones_three() -> None:
    assert seeds_required(30.0) == 5 and seeds_required(119.9) == 5
    assert seeds_required(120.0) == 3 and seeds_required(3600.0) == 3 and seeds_required(None) == 3


def test_the_interval_holds_the_median_and_lies_within_the_values() -> None:
    values = [0.91, 0.95, 0.93, 0.99, 0.90]
    low, high = bootstrap_interval(values)
    assert min(values) <= low <= statistics.median(values) <= high <= max(values)
    assert bootstrap_interval(values) == (low, high)  # seeded: the page is reproducible
    assert bootstrap_interval([0.5]) is None  # one value: no interval
    wide = bootstrap_interval([float(v) for v in range(100)])
    assert 35 <= wide[0] < 49.5 < wide[1] <= 64  # many values: much narrower than their range


def test_a_row_inside_the_best_interval_is_never_declared_the_loser() -> None:
    # The page's old ViT column: linear+relu 0.992 "won" beside full 0.983-0.986, one seed against three.
    cells = {
        "full": Cell.of([0.983, 0.986, 0.984]),
        "rope": Cell.of([0.978, 0.990, 0.985]),  # its median 0.985 lies inside full's... and full's in its
        "lucky": Cell.of([0.992]),  # one seed: no interval, it may tie but never win
    }
    result = verdict(cells, higher_is_better=True)
    assert result["winner"] is None and result["best"] == "lucky"
    assert result["marks"] == {"lucky": "best", "full": "≈ best", "rope": "≈ best"}


def test_a_row_clearly_outside_the_best_interval_is_behind_and_the_best_wins() -> None:
    cells = {
        "full": Cell.of([0.95, 0.96, 0.97, 0.96, 0.95]),
        "close": Cell.of([0.90, 0.955, 0.93]),  # its interval reaches into full's, its median is outside
        "linear": Cell.of([0.60, 0.62, 0.61]),
    }
    result = verdict(cells, higher_is_better=True)
    assert result["winner"] == "full" and result["marks"]["linear"] == "" and result["marks"]["full"] == "winner"
    # lower is better (a loss): the same rule, mirrored
    losses = {name: Cell.of([1 - v for v in values]) for name, values in
              {"full": [0.95, 0.96, 0.97], "linear": [0.60, 0.62, 0.61]}.items()}  # fmt: skip
    assert verdict(losses, higher_is_better=False)["winner"] == "full"


def test_a_median_inside_the_best_interval_ties_even_when_the_best_has_many_seeds() -> None:
    cells = {"a": Cell.of([0.80, 0.90, 0.85, 0.88, 0.82]), "b": Cell.of([0.84, 0.845, 0.846])}
    result = verdict(cells, higher_is_better=True)
    assert result["winner"] is None and result["marks"]["b"] == "≈ best"
    assert verdict({}, True) == {"winner": None, "best": None, "marks": {}}


def test_a_row_alone_in_its_column_is_no_winner() -> None:
    assert verdict({"full": Cell.of([0.9, 0.91, 0.92])}, True) == {"winner": None, "best": "full",
                                                                   "marks": {"full": "best"}}  # fmt: skip
