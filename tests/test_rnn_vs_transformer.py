"""experiments/rnn_vs_transformer.py: the exponent fit, the step-time sweep (also what gpu_check.py calls) and the
--quick command end to end on tiny generated data (no Multi30k needed)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import gpu_check  # noqa: E402
import rnn_vs_transformer  # noqa: E402


def test_the_fitted_exponent_recovers_a_power_law() -> None:
    lengths = (32, 64, 128, 256, 512)
    assert rnn_vs_transformer.fitted_exponent(lengths, [3e-5 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert rnn_vs_transformer.fitted_exponent(lengths, [1e-3 * n for n in lengths]) == pytest.approx(1.0)
    assert rnn_vs_transformer.fitted_exponent((32,), [1.0]) is None


def test_crossing_lists_the_lengths_where_the_rnn_step_is_cheaper() -> None:
    sweep = {"lengths": [32, 64, 128], "seconds": {"fixed": [1.0, 2.0, 4.0], "transformer": [2.0, 2.5, 3.0]}}
    assert rnn_vs_transformer.crossing(sweep) == {"fixed": [32, 64]}
    assert rnn_vs_transformer.crossing({"lengths": [32], "seconds": {"fixed": [1.0]}}) == {}


def test_the_step_time_sweep_runs_every_row_and_gpu_check_can_call_it() -> None:
    sweep = gpu_check.rnn_step_times("cpu", lengths=(4, 8))
    assert set(sweep["seconds"]) == set(rnn_vs_transformer.ROWS)
    assert all(t > 0 for times in sweep["seconds"].values() for t in times)
    assert set(sweep["exponents"]) == set(rnn_vs_transformer.ROWS) and set(sweep["crossing"]) == {
        "fixed",
        "dot",
        "additive",
    }


def test_quick_mode_writes_the_page_the_record_and_the_plots(tmp_path) -> None:
    out = tmp_path / "results"
    args = ["--quick", "--rows", "additive", "--out", str(out), "--runs", str(tmp_path / "runs"), "--lengths", "4,8"]
    results = rnn_vs_transformer.main(args)
    (record,) = results["training"]["additive"]
    assert 0.0 <= record["bleu_beam"] <= 100.0 and 0.0 <= record["bleu_greedy"] <= 100.0
    assert record["parameters"] > 0 and record["train_tokens_per_s"] > 0
    assert sum(b["sentences"] for b in record["bleu_beam_by_length"].values()) == record["test_sentences"]
    page = (out / "rnn_vs_transformer.md").read_text()
    assert "| RNN + additive attention |" in page and "Quick mode" in page
    assert "| RNN, fixed vector | not run yet |" in page  # rows not run say so
    assert (out / "rnn_vs_transformer_length.png").stat().st_size > 0
    assert (out / "rnn_vs_transformer_steps.png").stat().st_size > 0
    assert json.loads((out / "rnn_vs_transformer.json").read_text())["sweep"]["lengths"] == [4, 8]
    with pytest.raises(SystemExit, match="unknown row 'lstm'; valid choices: fixed, dot, additive, transformer"):
        rnn_vs_transformer.main(["--quick", "--rows", "lstm", "--out", str(out)])
