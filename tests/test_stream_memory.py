"""experiments/stream_memory.py in one-batch form: it writes synthetic shards, reads them streamed and in memory in
fresh processes, and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import stream_memory


def test_stream_memory_quick_writes_a_row_per_scale(tmp_path: Path) -> None:
    output = tmp_path / "data_at_scale.md"
    rows = stream_memory.main(["--quick", "--scales", "1", "--output", str(output)])
    assert [row["images"] for row in rows] == [64]
    assert rows[0]["stream_peak"] > 0 and rows[0]["memory_peak"] > 0
    assert "| 1x | 64 |" in output.read_text()
