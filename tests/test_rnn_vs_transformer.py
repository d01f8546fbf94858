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
    assert record["val_curve"] and record["val_curve"][0]["minutes"] >= 0.0  # val BLEU per epoch, from the run's log
    assert "| minutes to val BLEU" in page

    # --resume evaluates the finished run in its folder again instead of training a new one.
    finished = (tmp_path / "runs" / "additive_seed0" / "metrics.json").stat().st_mtime_ns
    again = rnn_vs_transformer.main([*args, "--resume"])["training"]["additive"][0]
    assert (tmp_path / "runs" / "additive_seed0" / "metrics.json").stat().st_mtime_ns == finished
    assert again["bleu_beam"] == record["bleu_beam"] and again["val_curve"] == record["val_curve"]
    assert 0.0 < again["wall_s"] < 3600.0  # from the log's first line to metrics.json
    with pytest.raises(SystemExit, match="unknown row 'lstm'; valid choices: fixed, dot, additive, transformer"):
        rnn_vs_transformer.main(["--quick", "--rows", "lstm", "--out", str(out)])


def test_the_page_marks_a_row_taken_from_another_page_and_keeps_the_notes(tmp_path) -> None:
    curve = [{"epoch": 0, "minutes": 5.0, "val_bleu": 10.0}, {"epoch": 1, "minutes": 10.0, "val_bleu": 20.0}]
    additive = {"parameters": 10, "bleu_beam": 21.0, "bleu_greedy": 20.0, "bleu_beam_by_length": {},
                "train_tokens_per_s": 5.0, "wall_s": 600.0, "val_curve": curve}  # fmt: skip
    fixed = additive | {"val_curve": [{"epoch": 0, "minutes": 4.0, "val_bleu": 15.0}]}
    transformer = additive | {"val_curve": [{"epoch": 0, "minutes": 3.0, "val_bleu": 25.0}], "source": "recipe page"}
    host = {"cpu": "cpu", "threads": 1, "torch": "2", "date": "today", "load": 0.0}
    results = {"host": host, "training": {"additive": [additive], "fixed": [fixed], "transformer": [transformer]},
               "notes": ["- a note kept across rebuilds"]}  # fmt: skip
    page = rnn_vs_transformer.write_page(results, tmp_path, quick=False).read_text()
    assert "| minutes to val BLEU 20.0 |" in page
    assert "| RNN + additive attention | 10 | 21.0 (n=1) | 20.0 (n=1) |" in page and "| 20.0 | 10.0 |" in page
    assert "| 15.0 | not reached |" in page  # the fixed vector never reached the additive row's best
    assert "| Transformer (the committed recipe) [1] |" in page
    assert "[1] Transformer (the committed recipe): recipe page" in page
    assert "| 25.0 | 3.0 |" in page
    assert "## Notes on these runs\n\n- a note kept across rebuilds" in page
    assert rnn_vs_transformer.minutes_to(curve, 15.0) == 10.0 and rnn_vs_transformer.minutes_to(curve, 30.0) is None


def test_resume_of_a_folder_without_a_run_log_is_one_line(tmp_path) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(SystemExit, match="holds no run.log"):
        rnn_vs_transformer.logged_wall(tmp_path)
    (tmp_path / "run.log").write_text("no timestamps here\n")
    with pytest.raises(SystemExit, match="has no timestamped line"):
        rnn_vs_transformer.logged_wall(tmp_path)
