"""experiments/vit_throughput.py runs (tiny shape, one round) in both precisions and reports zoo / timm ratios."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "experiments"))
import vit_throughput  # noqa: E402


def test_ratios_compare_each_precision_and_each_side_at_its_best() -> None:
    median = {"zoo ViT, train, 32-true": 100.0, "timm ViT, train, 32-true": 90.0,
              "zoo ViT, train, bf16-mixed": 150.0, "timm ViT, train, bf16-mixed": 60.0,
              "zoo ViT, inference, 32-true": 300.0, "timm ViT, inference, 32-true": 310.0,
              "zoo ViT, inference, bf16-mixed": 500.0, "timm ViT, inference, bf16-mixed": 400.0}  # fmt: skip
    ratios = vit_throughput.ratios(median, ["32-true", "bf16-mixed"])
    assert ratios["train, 32-true"] == 100.0 / 90.0 and ratios["train, bf16-mixed"] == 150.0 / 60.0
    assert ratios["train, fastest"] == 150.0 / 90.0  # timm's best is its fp32 step here
    assert ratios["inference, fastest"] == 500.0 / 400.0


def test_the_benchmark_runs_both_models_in_both_precisions(tmp_path) -> None:
    pytest.importorskip("timm")
    out = tmp_path / "vit.json"
    args = ["--image-size", "16", "--patch-size", "8", "--dim", "32", "--depth", "1", "--heads", "2",
            "--batch-size", "2", "--steps", "1", "--warmup", "1", "--rounds", "1", "--threads", "1"]  # fmt: skip
    record = run_benchmark("vit_throughput.py", args, out)
    paths = {
        f"{m} ViT, {k}, {p}" for m in ("zoo", "timm") for k in ("train", "inference") for p in vit_throughput.PRECISIONS
    }
    assert set(record["images_per_s"]) == paths
    assert all(value > 0 for values in record["images_per_s"].values() for value in values)
    assert {"train, 32-true", "train, bf16-mixed", "train, fastest", "inference, fastest"} <= set(record["ratios"])


def test_the_results_page_names_each_ratio_and_the_target_of_the_fastest(tmp_path) -> None:
    from experiments import reproduce

    median = {f"{m} ViT, {k}, {p}": 1.0 for m in ("zoo", "timm") for k in ("train", "inference")
              for p in vit_throughput.PRECISIONS}  # fmt: skip
    record = {"args": {"image_size": 64, "patch_size": 8, "dim": 192, "depth": 12, "heads": 3, "batch_size": 32,
                       "rounds": 3, "precisions": list(vit_throughput.PRECISIONS)},
              "parameters": 5.4e6, "threads": 2, "median": median,
              "ratios": {"train, 32-true": 0.95, "train, fastest": 1.5}}  # fmt: skip
    section, headline = reproduce.speed_markdown(None, record, None, tmp_path)
    assert "| ViT training images/s (fastest), zoo / timm | 1.500x | >= 1.2x |" in headline
    assert "| ViT training images/s (32-true), zoo / timm | 0.950x | - |" in headline
    assert "32-true and bf16-mixed" in section and "zoo / timm, train, fastest: **1.500x**" in section
