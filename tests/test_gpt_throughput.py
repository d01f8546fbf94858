"""experiments/gpt_throughput.py runs (tiny shape, one round) and reports the ratios #19 reads."""

from __future__ import annotations

import sys

from tests.helpers import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "experiments"))
import gpt_throughput  # noqa: E402


def test_ratios_compare_the_right_paths() -> None:
    median = {"zoo GPT, plain loop, 32-true": 100.0, "zoo GPT, Lightning, 32-true": 95.0,
              "zoo GPT, Lightning, bf16-mixed": 120.0, "HF GPT-2, plain loop, 32-true": 80.0,
              "HF GPT-2, plain loop, bf16-mixed": 60.0}  # fmt: skip
    ratios = gpt_throughput.ratios(median)
    assert ratios["Lightning / plain loop, fp32"] == 0.95
    assert ratios["Lightning bf16-mixed / Lightning fp32"] == 120.0 / 95.0
    assert ratios["zoo Lightning (fastest) / HF GPT-2 (fastest)"] == 120.0 / 80.0  # each side at its best
    assert ratios["zoo Lightning (fastest) / zoo Lightning fp32 eager"] == 120.0 / 95.0
    median |= {"zoo GPT, Lightning, compiled, bf16-mixed": 150.0, "HF GPT-2, plain loop, compiled, 32-true": 90.0}
    ratios = gpt_throughput.ratios(median)
    assert ratios["zoo Lightning (fastest) / zoo Lightning fp32 eager"] == 150.0 / 95.0  # the recipe's default path
    assert ratios["Lightning bf16-mixed / Lightning fp32"] == 120.0 / 95.0  # eager against eager
    assert ratios["zoo Lightning (fastest) / HF GPT-2 (fastest)"] == 150.0 / 90.0  # HF compiled counts as HF's best


def test_the_benchmark_runs_every_path_in_both_precisions(tmp_path) -> None:
    out = tmp_path / "throughput.json"
    args = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "2",
            "--steps", "2", "--warmup", "1", "--rounds", "1", "--threads", "1"]  # fmt: skip
    record = run_benchmark("gpt_throughput.py", args, out)
    zoo_paths = {f"zoo GPT, {loop}, {p}" for loop in ("plain loop", "Lightning") for p in ("32-true", "bf16-mixed")}
    assert zoo_paths <= set(record["tokens_per_s"])
    assert all(value > 0 for values in record["tokens_per_s"].values() for value in values)
    assert {"Lightning / plain loop, fp32", "Lightning bf16-mixed / Lightning fp32"} <= set(record["ratios"])
