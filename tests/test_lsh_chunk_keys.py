"""experiments/lsh_chunk_keys.py in one-batch form: a row per attention, rounds and setting, cosines in [-1, 1],
and the two settings' cosines to exact attention differ (the option is not ignored)."""

from __future__ import annotations

from experiments import lsh_chunk_keys


def test_the_quick_form_writes_a_row_per_setting_and_the_settings_differ(capsys) -> None:
    table = lsh_chunk_keys.main(["--length", "256", "--rounds", "2", "--repeats", "1", "--chunk-size", "16"])
    assert capsys.readouterr().out.strip() == table.strip()
    rows = [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    cells = {(row[0], row[1], row[2]): row[3] for row in rows[1:]}
    assert set(cells) == {
        (attention, "2", setting) for attention in ("bidirectional", "causal") for setting in ("bucket", "chunk")
    } | {("bidirectional", "2", "Reformer's sort (dense)")}
    assert all(-1.0 <= float(value) <= 1.0 for value in cells.values())
    for attention in ("bidirectional", "causal"):  # a query sees more keys under chunk: closer to exact attention
        assert float(cells[(attention, "2", "chunk")]) > float(cells[(attention, "2", "bucket")])
