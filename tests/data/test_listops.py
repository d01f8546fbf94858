"""ListOps: hand-checked answers, the generator's determinism, lengths, depth and arguments, disjoint splits, and
the data module's batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from zoo.data.listops import (
    OPERATORS,
    TOKEN_IDS,
    VOCABULARY,
    ListOpsDataModule,
    TreeTooLong,
    evaluate_listops,
    generate_listops,
    generate_tree,
)
from zoo.errors import DataError

HAND_CHECKED = {
    "7": 7,
    "[MAX 2 9 [MIN 4 7 ] 0 ]": 9,
    "[MIN 3 [MAX 1 5 ] 4 ]": 3,
    "[SM 9 9 [MAX 0 8 ] ]": 6,  # 9 + 9 + 8 = 26
    "[MED 7 [SM 5 6 ] 3 ]": 3,  # median(7, 1, 3)
    "[MED 1 2 3 4 ]": 2,  # the mean of the middle two, 2.5, rounded down (LRA's int(np.median))
    "[MED 9 8 ]": 8,
    "[MAX [MIN 4 [SM 3 3 ] ] [MED 0 1 2 ] 3 ]": 4,
}


@pytest.mark.parametrize("expression", sorted(HAND_CHECKED))
def test_hand_checked_expressions_have_their_answer(expression: str) -> None:
    assert evaluate_listops(expression) == HAND_CHECKED[expression]


def reference_value(tokens: list[str]) -> int:
    """LRA's rules (to_value in lra_benchmarks/data/listops.py: np.median, np.sum % 10) by recursive descent."""
    rules = {"[MAX": max, "[MIN": min, "[MED": lambda v: int(np.median(v)), "[SM": lambda v: int(np.sum(v)) % 10}
    position = 0

    def parse() -> int:
        nonlocal position
        token = tokens[position]
        position += 1
        if token not in rules:
            return int(token)
        values = []
        while tokens[position] != "]":
            values.append(parse())
        position += 1
        return rules[token](values)

    return parse()


def nesting(tokens: tuple[str, ...]) -> tuple[int, int]:
    """(deepest operator nesting + 1 for the leaves, most arguments of one operator)."""
    depth, deepest, counts, most = 0, 1, [], 0
    for token in tokens:
        if token in OPERATORS:
            if counts:
                counts[-1] += 1
            depth += 1
            counts.append(0)
        elif token == "]":
            most = max(most, counts.pop())
            depth -= 1
        else:
            if counts:
                counts[-1] += 1
            deepest = max(deepest, depth + 1)
    return deepest, most


def test_generated_answers_follow_lras_rules() -> None:
    examples = generate_listops(200, 8, 128, seed=3)
    assert all(evaluate_listops(tokens) == answer == reference_value(list(tokens)) for tokens, answer in examples)
    assert len({answer for _, answer in examples}) == 10  # every answer occurs


def test_generator_is_deterministic_and_the_seed_matters() -> None:
    assert generate_listops(30, 16, 64, seed=1) == generate_listops(30, 16, 64, seed=1)
    assert generate_listops(30, 16, 64, seed=1) != generate_listops(30, 16, 64, seed=2)


def test_generated_lengths_depth_and_arguments_stay_in_bounds() -> None:
    examples = generate_listops(100, 20, 60, seed=0, max_depth=5, max_args=3)
    lengths = [len(tokens) for tokens, _ in examples]
    assert min(lengths) >= 20 and max(lengths) <= 60 and len(set(examples)) == 100
    shapes = [nesting(tokens) for tokens, _ in examples]
    assert max(depth for depth, _ in shapes) == 5 and max(args for _, args in shapes) == 3
    unbounded = [nesting(tokens) for tokens, _ in generate_listops(100, 20, 60, seed=0, max_depth=8, max_args=10)]
    assert max(depth for depth, _ in unbounded) > 5 and max(args for _, args in unbounded) > 3  # the bounds acted


def test_the_length_limit_abandons_exactly_the_trees_that_outgrow_it() -> None:
    for seed in range(100):
        tokens, value = generate_tree(random.Random(seed), 10, 10)
        if len(tokens) <= 30:
            assert generate_tree(random.Random(seed), 10, 10, max_length=30) == (tokens, value)
        else:
            with pytest.raises(TreeTooLong):
                generate_tree(random.Random(seed), 10, 10, max_length=30)


def test_data_module_splits_are_disjoint_padded_and_reproducible() -> None:
    settings = {"num_train": 60, "num_val": 20, "num_test": 20, "max_length": 96, "batch_size": 16}
    data = ListOpsDataModule(**settings)
    data.setup()
    rows = {split: {tuple(row.tolist()) for row in data.splits[split].tensors[0]} for split in ("train", "val", "test")}
    assert [len(rows[s]) for s in ("train", "val", "test")] == [60, 20, 20]
    assert not (rows["train"] & rows["val"] or rows["train"] & rows["test"] or rows["val"] & rows["test"])
    tokens, answers = next(iter(data.train_dataloader()))
    assert tokens.shape == (16, 96) and tokens.dtype == torch.long and answers.shape == (16,)
    lengths = (tokens != TOKEN_IDS["<pad>"]).sum(dim=1)
    assert lengths.min() >= 96 // 4  # min_length null: a quarter of max_length
    for row, answer in zip(tokens, answers):  # the ids decode to an expression with this answer
        expression = [VOCABULARY[i] for i in row.tolist() if i != 0]
        assert evaluate_listops(expression) == answer
    again = ListOpsDataModule(**settings)
    again.setup()
    assert torch.equal(again.splits["test"].tensors[0], data.splits["test"].tensors[0])
    other = ListOpsDataModule(**settings, seed=1)
    other.setup()
    assert not torch.equal(other.splits["test"].tensors[0], data.splits["test"].tensors[0])


def test_min_length_is_used() -> None:
    data = ListOpsDataModule(num_train=20, num_val=5, num_test=5, max_length=96, min_length=80)
    data.setup()
    assert ((data.splits["train"].tensors[0] != 0).sum(dim=1) >= 80).all()


@pytest.mark.parametrize(
    "expression, message",
    [("[MAX 1 2", "not closed"), ("[MIN ]", "empty"), ("1 2", "continues after its end"), ("[MAX 1 x ]", "'x'")],
)
def test_malformed_expressions_are_one_line_errors(expression: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        evaluate_listops(expression)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"vocab_size": 20}, "data.vocab_size=16"),
        ({"num_classes": 5}, "data.num_classes=10"),
        ({"min_length": 300, "max_length": 200}, "min_length"),
        ({"max_args": 1}, "max_args"),
        ({"num_val": 0}, "num_val"),
    ],
)
def test_bad_settings_are_one_line_errors(settings: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        ListOpsDataModule(**settings)
