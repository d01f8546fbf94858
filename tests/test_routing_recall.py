"""experiments/routing_recall.py: which hops of associative recall routing attention's clusters allow, counted
on a checkpoint (one cluster: every hop allowed, as full causal attention)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments import routing_recall
from tests.helpers import as_checkpoint, tiny_model
from zoo.data.mqar import generate_mqar
from zoo.models.gpt import GPT, GPTConfig


def routing_checkpoint(path: Path, attention: dict) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=1, n_embd=16, attention=attention))
    model.tokenizer, model.preprocessing, model.settings = None, None, {}
    return as_checkpoint(model, path)


def test_answer_positions_are_the_values_after_the_queried_keys() -> None:
    inputs, targets = generate_mqar(4, 16, 3, 32, seed=1)
    example, query, value = routing_recall.answer_positions(inputs, targets, 3)
    assert len(query) == 4 * 3  # every key is queried once
    assert torch.equal(inputs[example, value - 1], inputs[example, query])  # the value's key is the query's token
    assert torch.equal(inputs[example, value], targets[example, query])  # and the value is the answer
    assert (value < 6).all() and (value % 2 == 1).all()


def test_one_cluster_allows_every_hop_and_many_clusters_cut_them(tmp_path: Path, capsys) -> None:
    one = routing_checkpoint(tmp_path / "one.ckpt", {"variant": "routing", "clusters": 1, "chunk_size": 16})
    many = routing_checkpoint(tmp_path / "many.ckpt", {"variant": "routing", "clusters": 16, "chunk_size": 1})
    table = routing_recall.main([str(one), str(many), "--pairs", "3", "--examples", "16"])
    assert capsys.readouterr().out.strip() == table.strip()
    rows = [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][0] == "checkpoint" and [row[0] for row in rows[1:]] == [str(one), str(many)]
    assert rows[1][1:] == ["48", "1.000", "1.000", "8.5"]  # one cluster, one chunk: full causal attention
    assert float(rows[2][4]) < 4.0  # a chunk of 1: at most the token itself and one from the previous chunk
    assert "(n + 1) / 2 = 8.5 (n=16)" in table


def test_a_model_without_routing_is_refused(tmp_path: Path) -> None:
    full = routing_checkpoint(tmp_path / "full.ckpt", {"variant": "full"})
    with pytest.raises(ValueError, match="no routing attention"):
        routing_recall.main([str(full)])


def test_bad_input_ends_in_one_line_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit, match=r"^error: '.*nope.ckpt' does not exist; valid: a checkpoint"):
        routing_recall.cli([str(tmp_path / "nope.ckpt")])
    one = routing_checkpoint(tmp_path / "one.ckpt", {"variant": "routing", "clusters": 1, "chunk_size": 16})
    with pytest.raises(SystemExit, match=r"^error: data.seq_len=16 is too short for 8 key-value pairs"):
        routing_recall.cli([str(one), "--pairs", "8"])
    with pytest.raises(SystemExit):
        routing_recall.cli([str(one), "--examples", "0"])
    assert "--examples: must be a positive int, got '0'" in capsys.readouterr().err
    vit = as_checkpoint(tiny_model("vit", {"variant": "routing"}), tmp_path / "vit.ckpt")
    with pytest.raises(SystemExit, match=r"^error: '.*vit.ckpt' holds a model=vit; valid: a checkpoint of model=gpt"):
        routing_recall.cli([str(vit)])
