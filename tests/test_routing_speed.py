"""experiments/routing_speed.py in one-batch form: a forward and a training-step row per length, with positive
times and ratios that are the peer's time over zoo's. Needs routing-transformer (the peers' extra)."""

from __future__ import annotations

import pytest

pytest.importorskip("routing_transformer")

from experiments import routing_speed  # noqa: E402


def test_the_quick_form_writes_both_passes_per_length_with_ratios_of_its_times(capsys) -> None:
    table = routing_speed.main(["--lengths", "64", "--rounds", "1"])
    assert capsys.readouterr().out == table
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["64", "fwd"], ["64", "fwd+bwd"]]
    half = 0.05  # the times are printed to 0.1 ms, the ratios from the unrounded times
    for row in rows:
        wall, peer_wall, wall_ratio, cpu, peer_cpu, cpu_ratio = map(float, row[2:])
        assert min(wall, peer_wall, cpu, peer_cpu) > 0
        for zoo, peer, ratio in ((wall, peer_wall, wall_ratio), (cpu, peer_cpu, cpu_ratio)):
            assert (peer - half) / (zoo + half) - 0.005 <= ratio <= (peer + half) / max(zoo - half, 1e-9) + 0.005
