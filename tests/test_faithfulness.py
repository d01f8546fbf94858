"""experiments/faithfulness.py: the perturbation curves and their areas on a hand-checkable case (a "model" whose
probability is whether one known token is intact), the bootstrap interval, and the one command's smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from faithfulness import FRACTIONS, area, bootstrap_interval, network, perturbation_curves, short_trained  # noqa: E402

from tests.helpers import tiny_fashion_mnist  # noqa: E402
from zoo.explain import METHODS  # noqa: E402

KNOWN = 5  # of 16 tokens, one pixel each on a 4 x 4 image


def one_token_probability(pixels: torch.Tensor) -> torch.Tensor:
    """1 while the known pixel keeps its value 200, 0 once it is replaced by the fill value 0."""
    return (pixels.flatten(1)[:, KNOWN] == 200).float()


def pixel_mask(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.reshape(-1, 1, 4, 4)


def test_the_order_that_removes_the_deciding_token_first_has_the_lowest_deletion_and_highest_insertion_area() -> None:
    pixels = torch.full((1, 1, 4, 4), 200, dtype=torch.uint8)
    oracle = torch.zeros(1, 16)
    oracle[0, KNOWN] = 1.0
    deletion, insertion = perturbation_curves(one_token_probability, pixels, pixel_mask, oracle, fill=0)
    # at 10% round(1.6) = 2 tokens are removed, the deciding one among them: the curve falls at the first step
    np.testing.assert_array_equal(deletion[0], [1.0] + [0.0] * 10)
    np.testing.assert_array_equal(insertion[0], [0.0] + [1.0] * 10)
    assert area(deletion)[0] == pytest.approx(0.05) and area(insertion)[0] == pytest.approx(0.95)
    last = -oracle  # the deciding token ranked last: removed only with the whole image
    deletion_late, insertion_late = perturbation_curves(one_token_probability, pixels, pixel_mask, last, fill=0)
    assert area(deletion_late)[0] == pytest.approx(0.95) and area(insertion_late)[0] == pytest.approx(0.05)
    assert len(FRACTIONS) == 11


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_more_images() -> None:
    rng = np.random.default_rng(0)
    few, many = rng.normal(size=20), rng.normal(size=2000)
    for values in (few, many):
        low, high = bootstrap_interval(values)
        assert low < values.mean() < high
    assert np.ptp(bootstrap_interval(many)) < np.ptp(bootstrap_interval(few)) / 5
    assert bootstrap_interval(np.full(10, 0.3)) == pytest.approx((0.3, 0.3))


def test_short_training_builds_the_fashion_recipes_network_and_keeps_its_weights(tmp_path: Path) -> None:
    fashion = tiny_fashion_mnist(tmp_path / "fashion-mnist", train=40, test=10)
    model = short_trained("fashion_vit_full", 0, 2, tmp_path / "work", str(fashion))
    # conf/experiment/vit_fashion_mnist.yaml's network on 28 x 28 images: the convolutional stem, 7 x 7 patches
    assert (model.config.image_size, model.config.patch_size, model.config.stem) == (28, 4, "conv")
    assert model.preprocessing.mean == (0.2860,) and model.preprocessing.classes[0] == "T-shirt/top"
    again = short_trained("fashion_vit_full", 0, 2, tmp_path / "work", str(fashion))  # read back, not retrained
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    local, _ = network("fashion_vit_local", ["attention.window=14"], str(fashion))
    assert local.config.attention.variant == "local" and local.config.attention.options["window"] == 14
    with pytest.raises(ValueError, match=r"build vit_full \| .* not 'clip_full'"):
        network("clip_full", [], str(fashion))


def test_the_quick_run_measures_every_method_on_every_model_and_plots(tmp_path: Path) -> None:
    fashion = tiny_fashion_mnist(tmp_path / "fashion-mnist", train=20, test=20)  # generated: no dataset needed
    models = ["vit_full", "vit_local", "seq_full", "fashion_vit_full"]
    done = subprocess.run(
        [sys.executable, "experiments/faithfulness.py", "--quick", "--out", str(tmp_path), "--models", *models,
         "--fashion-dir", str(fashion)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "faithfulness.json").read_text())["results"]
    assert set(results) == set(models)
    for methods in results.values():
        assert set(methods) == set(METHODS)
        for row in methods.values():
            for name in ("deletion", "insertion"):
                low, high = row[name]["ci95"]
                assert 0.0 <= low <= row[name]["auc"] <= high <= 1.0
                assert len(row[name]["curve"]) == 11
    assert (tmp_path / "faithfulness.png").stat().st_size > 0
    assert "| vit_full | grad_attention |" in done.stdout
