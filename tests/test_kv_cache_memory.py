"""experiments/kv_cache_memory.py: the KV cache of a grouped-query GPT shrinks by num_heads / kv_heads, read
off the caches themselves (the script asserts the bytes per token and cached = uncached logits)."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments import kv_cache_memory


def test_kv_cache_bytes_per_token_shrink_by_heads_over_kv_heads(tmp_path: Path, monkeypatch, capsys) -> None:
    output = tmp_path / "kv.md"
    arguments = ["--n-layer", "2", "--n-head", "4", "--n-embd", "32", "--context", "12", "--output", str(output)]
    monkeypatch.setattr(sys, "argv", ["kv_cache_memory.py", *arguments])
    kv_cache_memory.main()
    rows = [
        line.split(" | ") for line in output.read_text().splitlines() if line.startswith("| ") and "---" not in line
    ]
    table = {int(row[0].strip("| ")): (row[1], row[2]) for row in rows[1:]}  # kv_heads -> (bytes, ratio)
    # 2 (keys, values) x 2 layers x kv_heads x head_dim 8 x 4 bytes
    assert table == {1: ("128", "0.250x"), 2: ("256", "0.500x"), 4: ("512", "1.000x")}
    assert "written to" in capsys.readouterr().out
