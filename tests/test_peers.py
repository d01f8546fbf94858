"""experiments/peers.py: its quality measure against a hand computation, and the script in one-batch form (every pair
at a short length, one round) writing its page and JSON with every column; skipped where a peer is not installed
(the optional extra `peers`: pip install --no-deps -r experiments/peers-requirements.txt)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from experiments import peers


def test_mean_cosine_is_the_mean_over_rows_of_each_rows_cosine() -> None:
    """Two rows per head worked by hand: (1, 0) vs (1, 1) is 1 / sqrt(2); (0, 2) vs (0, -3) is -1; (3, 4) vs (6, 8)
    is 1; a zero row counts 0 (no direction: it keeps nothing of exact attention)."""
    out = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]], [[3.0, 4.0], [0.0, 0.0]]]])  # (B=1, H=2, n=2, D=2)
    exact = torch.tensor([[[[1.0, 1.0], [0.0, -3.0]], [[6.0, 8.0], [1.0, 1.0]]]])
    expected = (1 / math.sqrt(2) - 1 + 1 + 0) / 4
    assert peers.mean_cosine(out, exact) == pytest.approx(expected, abs=1e-6)


def test_exact_shared_qk_attention_hides_self_unless_it_is_all_there_is() -> None:
    """The blocked shared-QK reference against the dense n x n formula (keys q / |q|; the first causal row sees only
    itself), with blocks smaller than n."""
    generator = torch.Generator().manual_seed(0)
    q, v = (torch.randn(1, 2, 7, 4, generator=generator) for _ in range(2))
    keys = q / q.norm(dim=-1, keepdim=True)
    for causal in (False, True):
        allowed = ~torch.eye(7, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
            allowed[0, 0] = True
        scores = (q @ keys.transpose(-2, -1) / 2).masked_fill(~allowed, float("-inf"))
        expected = torch.softmax(scores, dim=-1) @ v
        original = peers.EXACT_BLOCK
        peers.EXACT_BLOCK = 3
        try:
            got = peers.exact_attention(q, q, v, causal=causal, shared_qk=True)
        finally:
            peers.EXACT_BLOCK = original
        torch.testing.assert_close(got, expected)


def test_uniform_attention_is_the_mean_of_the_visible_values() -> None:
    v = torch.arange(6.0).view(1, 1, 3, 2)  # rows (0, 1), (2, 3), (4, 5)
    torch.testing.assert_close(
        peers.uniform_attention(v, causal=False), torch.tensor([[2.0, 3.0]] * 3).view(1, 1, 3, 2)
    )
    torch.testing.assert_close(
        peers.uniform_attention(v, causal=True), torch.tensor([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]).view(1, 1, 3, 2)
    )


def test_one_batch_form_writes_every_pair_and_column(tmp_path, capsys) -> None:
    for module, _distribution in peers.PEER_PACKAGES.values():
        reason = f"experiments/peers.py's peer {module} does not import (extra `peers`)"
        pytest.importorskip(module, reason=reason, exc_type=ImportError)  # missing, or missing one of its own
    records = peers.main(["--lengths", "256", "--rounds", "1", "--out", str(tmp_path)])
    assert [r["pair"] for r in records] == list(peers.PAIRS)
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved["results"] == json.loads(json.dumps(records))
    for key in ("CPU", "lscpu model name", "load average at start", "load average at the end", "torch threads"):
        assert saved["conditions"][key], key
    assert saved["conditions"]["torch threads"] == "1"
    for record in records:
        for mode in peers.MODES:
            for clock in ("wall", "cpu"):
                zoo, peer = (record[mode][side][f"{clock}_ms"] for side in ("zoo", "peer"))
                assert zoo > 0 and peer > 0
                assert record[mode][f"{clock}_ratio"] == pytest.approx(peer / zoo)
        assert all(-1.0 <= value <= 1.0 for value in record["quality"].values())
        # Linformer gets zoo's weights: the same function, so the same cosine; every other pair differs.
        if record["pair"] == "compressed":
            assert record["quality"]["zoo"] == pytest.approx(record["quality"]["peer"], abs=1e-4)
        else:
            assert "uniform" in record["quality"]
    page = (tmp_path / "peers.md").read_text()
    for heading in ("wall clock", "thread CPU time"):
        assert f"forward / forward + backward ({heading}; > 1: zoo faster)" in page
    assert "| comparison | n=256 speed | n=256 cosine zoo / peer (uniform) |" in page
    for record in records:
        assert record["title"] in page
    assert "load average at the end" in page and "lscpu model name" in page
    assert "n=256 favor" in capsys.readouterr().out
