"""experiments/additive_speed.py runs (--quick: small shapes, one round), times both paths and finds them equal."""

from __future__ import annotations

import sys

from tests.helpers import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "experiments"))
import additive_speed  # noqa: E402


def test_both_paths_are_timed_on_every_shape_and_agree(tmp_path) -> None:
    page = tmp_path / "additive_speed.md"
    record = run_benchmark("additive_speed.py", ["--quick", "--page", str(page)], tmp_path / "additive.json")
    assert [row["column"] for row in record["rows"]] == [shape[0] for shape in additive_speed.QUICK_SHAPES]
    for row in record["rows"]:
        assert row["fast_path_applies"]  # the shapes are large enough for the fast path: two paths compared
        for mode in ("train", "inference"):
            assert row[f"{mode}_reference_ms"] > 0 and row[f"{mode}_fast_ms"] > 0
            assert row[f"{mode}_max_difference"] < 1e-5  # the same function, to fp32 rounding
    assert [row["keys"] for row in record["decode"]] == additive_speed.QUICK_DECODE_KEYS
    for row in record["decode"]:  # both paths timed, and the page says which one the kernel takes at this size
        assert row["reference_us"] > 0 and row["fast_us"] > 0
        assert row["fast_path_applies"] == (row["row_elements"] >= record["min_row_elements"])
    assert [row["fast_path_applies"] for row in record["decode"]] == [False, True]  # either side of the threshold
    errors = record["tanh_errors"]
    assert 0 < errors["torch.tanh"] <= errors["2 sigmoid(2u) - 1"] < 1e-6  # a few units in fp32's last place
    text = page.read_text()
    assert text.count("\n| small ") == 2 and "causal" in text and "2 sigmoid(2u) - 1" in text
    assert "| 32 | 1024 |" in text and "| 2048 | 65536 |" in text  # the decoding table's rows
