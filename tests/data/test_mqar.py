"""zoo/data/mqar.py: multi-query associative recall as Zoology (Arora et al. 2023) generates it, checked by hand on
small examples, and the data module's disjoint splits; the task's accuracy counts the queries only."""

from __future__ import annotations

import pytest
import torch

from zoo.data.mqar import IGNORE, MQARDataModule, generate_mqar
from zoo.errors import DataError


def test_a_small_example_checked_by_hand() -> None:
    inputs, targets = generate_mqar(2, 12, 2, vocab_size=10, seed=0, random_non_queries=False)
    # Keys 1-4, values 5-9. Example 0: pairs 3->5, 4->5; key 4 queried at position 6, key 3 at 10.
    assert inputs[0].tolist() == [3, 5, 4, 5, 0, 0, 4, 5, 0, 0, 3, 5]
    assert targets[0].tolist() == [IGNORE] * 6 + [5] + [IGNORE] * 3 + [5, IGNORE]
    # Example 1: pairs 2->5, 1->9; key 1 at position 6 (answer 9), key 2 at 8 (answer 5).
    assert inputs[1].tolist() == [2, 5, 1, 9, 0, 0, 1, 9, 2, 5, 0, 0]
    assert targets[1].tolist() == [IGNORE] * 6 + [9, IGNORE, 5] + [IGNORE] * 3
    filled, same_targets = generate_mqar(2, 12, 2, vocab_size=10, seed=0)  # the empty positions: random tokens
    assert torch.equal(same_targets, targets) and not (filled == 0).all()
    assert torch.equal(filled[targets != IGNORE], inputs[targets != IGNORE])  # the queries stay where they were


@pytest.mark.parametrize("seq_len, pairs", [(64, 4), (256, 16), (512, 64)])
def test_every_query_asks_for_the_value_paired_with_its_key(seq_len: int, pairs: int) -> None:
    inputs, targets = generate_mqar(50, seq_len, pairs, seed=3)
    assert inputs.shape == targets.shape == (50, seq_len) and inputs.dtype == torch.int64
    for x, y in zip(inputs.tolist(), targets.tolist()):
        keys, values = x[0 : 2 * pairs : 2], x[1 : 2 * pairs : 2]
        assert len(set(keys)) == pairs and max(keys) < 8192 // 2 <= min(values)
        lookup = dict(zip(keys, values))
        asked = [(x[t], y[t]) for t in range(seq_len) if y[t] != IGNORE]
        assert len(asked) == pairs and sorted(k for k, _ in asked) == sorted(keys)  # each key queried once
        assert all(lookup[key] == answer for key, answer in asked)
        assert all(t >= 2 * pairs for t in range(seq_len) if y[t] != IGNORE)  # after the context
    again = generate_mqar(50, seq_len, pairs, seed=3)
    assert torch.equal(again[0], inputs) and not torch.equal(generate_mqar(50, seq_len, pairs, seed=4)[0], inputs)


def test_the_splits_are_disjoint_and_seeded() -> None:
    data = MQARDataModule(seq_len=16, num_kv_pairs=2, vocab_size=12, num_train=400, num_val=200, num_test=200)
    data.setup()
    contexts = {split: {tuple(row) for row in data.splits[split].tensors[0][:, :4].tolist()} for split in data.splits}
    assert not contexts["train"] & contexts["val"] and not contexts["train"] & contexts["test"]
    assert len(data.splits["val"]) < 200  # with 5 keys and 6 values, many contexts repeat: those were dropped
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (64, 16) and data.block_size == 16


@pytest.mark.parametrize(
    "kwargs, message",
    [({"seq_len": 10, "num_kv_pairs": 4}, "use data.seq_len >= 15"),
     ({"num_kv_pairs": 8, "vocab_size": 12}, "use data.vocab_size >= 18"),
     ({"seq_len": 0}, "data.seq_len must be a positive int, got 0")],
)  # fmt: skip
def test_settings_that_cannot_hold_a_sequence_get_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        MQARDataModule(**kwargs)


def test_the_task_scores_only_the_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.tasks.associative_recall import AssociativeRecallTask

    task = AssociativeRecallTask(net={"vocab_size": 10, "block_size": 12, "n_layer": 1, "n_head": 1, "n_embd": 8},
                                 sample={"max_new_tokens": 0})  # fmt: skip
    inputs, targets = generate_mqar(2, 12, 2, vocab_size=10, seed=0, random_non_queries=False)
    answers = targets.clamp(min=0)  # right at the 4 queries; 0 (wrong) at every other position
    answers[1, 8] = 1  # one query of the four answered wrong
    logits = torch.nn.functional.one_hot(answers, 10).float()
    monkeypatch.setattr(task, "network", lambda: lambda x, scored: logits[scored])
    task.test_step((inputs, targets), 0)
    assert float(task.test_acc.compute()) == pytest.approx(0.75)


def test_the_loss_at_the_queries_alone_is_the_language_model_loss() -> None:
    """The head runs at the queries only: the same loss and gradients as the full (B, T, vocab) logits with every
    other target ignored (fp64)."""
    from zoo.tasks.associative_recall import AssociativeRecallTask

    torch.manual_seed(0)
    task = AssociativeRecallTask(net={"vocab_size": 16, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8},
                                 sample={"max_new_tokens": 0}).double()  # fmt: skip
    batch = generate_mqar(3, 16, 3, vocab_size=16, seed=1)
    parameters = list(task.net.parameters())
    reference = torch.nn.functional.cross_entropy(task.net(batch[0]).flatten(0, 1), batch[1].flatten())
    expected = torch.autograd.grad(reference, parameters)
    loss = task._loss(batch)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for got, want in zip(torch.autograd.grad(loss, parameters), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
