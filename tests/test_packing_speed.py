"""experiments/packing_speed.py runs (--quick: tiny models, one batch per path) and counts real tokens only."""

from __future__ import annotations

import sys

import torch

from tests.helpers import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "experiments"))
import packing_speed  # noqa: E402


def test_every_path_trains_and_reports_tokens_per_second(tmp_path) -> None:
    record = run_benchmark("packing_speed.py", ["--quick", "--threads", "1"], tmp_path / "packing.json")
    for model in ("gpt", "sequence_classifier"):
        assert set(record["tokens_per_s"][model]) == set(packing_speed.PATHS)
        assert all(rate > 0 for rate in record["tokens_per_s"][model].values())
        assert set(record["packed_speedup"][model]) == {"packed / padded to block", "packed / padded to batch"}


def test_the_paths_hold_the_same_documents_and_targets() -> None:
    documents = [torch.arange(1, n + 1) for n in (3, 5, 2, 6, 1, 4)]
    batches = {path: packing_speed.gpt_batches(documents, 2, 8, path) for path in packing_speed.PATHS}
    targets = {path: sum(packing_speed.real_tokens(b) for b in found) for path, found in batches.items()}
    assert set(targets.values()) == {sum(len(d) - 1 for d in documents)}  # each token predicts its successor once
    packed = batches["packed"][0]
    assert packed["x"].shape == (2, 8) and packed["document_ids"].shape == (2, 8)
    assert packed["x"][0, :8].tolist() == [1, 2, 3, 1, 2, 3, 4, 5]
    assert packed["y"][0].tolist() == [2, 3, -100, 2, 3, 4, 5, -100]
