"""experiments/kv_cache_benchmark.py runs (tiny GPT, three contexts) and the results page reads its ratios."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "experiments"))
import kv_cache_benchmark  # noqa: E402


def test_the_benchmark_times_every_context_and_the_uncached_reference_up_to_its_limit(tmp_path) -> None:
    args = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--vocab-size", "17", "--new-tokens", "2",
            "--repeats", "1", "--contexts", "8", "16", "32", "--uncached-max-context", "16",
            "--threads", "1"]  # fmt: skip
    record = run_benchmark("kv_cache_benchmark.py", args, tmp_path / "kv.json")
    per_token = record["seconds_per_token"]
    assert set(per_token) == {"full", "rope", "local", "linear"}
    for row in per_token.values():
        assert {f"cached@{c}" for c in (8, 16, 32)} <= set(row) and all(value > 0 for value in row.values())
    assert {key for key in per_token["full"] if key.startswith("uncached")} == {"uncached@8", "uncached@16"}


def test_the_results_page_holds_each_context_ratio_and_the_bounded_state_target(tmp_path) -> None:
    from experiments import reproduce

    def row(*ms: float) -> dict:
        return {f"cached@{c}": m / 1000 for c, m in zip((128, 1024, 8192), ms)}

    args = {"n_layer": 12, "n_embd": 768, "vocab_size": 50257, "repeats": 3, "contexts": [128, 1024, 8192]}
    per_token = {"full": row(10, 11, 20), "local": row(10, 10.2, 10.5), "linear": row(10, 10, 12)}
    record = {"args": args, "seconds_per_token": per_token}
    section, headline = reproduce.speed_markdown(None, None, record, tmp_path)
    assert "| per-token generation time, context 1024 vs 128 (worst variant) | 1.10x | <= 1.5x |" in headline
    # full attention's cache grows with the context: only local and linear are held to the 8192 target
    assert (
        "| per-token generation time, context 1024 and 8192 vs 128 (worst of local, linear) | 1.20x | <= 1.1x |"
    ) in headline
    assert "| full | 10.00 | 11.00 | 20.00 | 1.10x | 2.00x |" in section


def test_contexts_that_give_no_ratio_are_refused_in_one_line(capsys) -> None:
    for contexts in (["128"], ["128", "128"], ["0", "128"]):
        with pytest.raises(SystemExit) as stop:
            kv_cache_benchmark.parse_args(["--contexts", *contexts])
        assert stop.value.code == 2
        assert "--contexts needs at least two different positive lengths" in capsys.readouterr().err
