"""experiments/attention_sinks.py in its smallest form: a few training steps on a tiny generated corpus, then the
perplexity table at 1x, 4x and 16x the block for full attention, a window and the window with sinks."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments import attention_sinks
from tests.helpers import tiny_text


def test_the_sinks_table_has_every_setting_at_every_length(tmp_path: Path, monkeypatch, capsys) -> None:
    corpus = tiny_text(tmp_path / "input.txt")
    arguments = ["--data", str(corpus), "--block-size", "8", "--steps", "2", "--sinks", "2", "--eval-tokens", "64"]
    monkeypatch.setattr(sys, "argv", ["attention_sinks.py", *arguments])
    attention_sinks.main()
    out = capsys.readouterr().out
    assert out.startswith("trained 2 steps at block 8")
    lines = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert lines[0] == "| attention (trained: full, block 8) | ppl at 8 | ppl at 32 | ppl at 128 |"
    table = {row.split(" | ")[0].strip("| "): row.strip("| ").split(" | ")[1:] for row in lines[1:]}
    assert list(table) == ["full", "window 8", "window 8 + 2 sinks"]
    vocabulary = len(set(corpus.read_text()))
    for cells in table.values():  # a perplexity per length, near the vocabulary's after 2 steps
        assert len(cells) == 3 and all(1 < float(cell) < 4 * vocabulary for cell in cells)
    assert table["full"][0] == table["window 8"][0]  # at the block itself a window of the block is full attention
