"""ListOps (Nangia & Bowman 2018) as Long Range Arena writes it (Tay et al. 2021): nested list operations
in prefix form, e.g. `[MAX 2 9 [MIN 4 7 ] 0 ]` = 9, classified into their answer 0-9.

The generator is LRA's (lra_benchmarks/data/listops.py): a node is a digit with probability 0.75 (always at
`max_depth`), otherwise one of MAX, MIN, MED (the median, rounded down) or SM (the sum modulo 10) over 2 to
`max_args` children; trees are drawn until one has `min_length` to `max_length` tokens (inclusive; LRA: 500
to 2000, exclusive). LRA's files also write the parentheses of a binarised tree, which carry no information;
they are left out here and lengths count the tokens written (digits, operators and closing brackets), as LRA
counts them. Expressions are drawn with one seeded generator, deduplicated, and split in order into train |
val | test: the splits are disjoint and the same for the same settings.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from zoo.data.sequences import TokenSequenceDataModule
from zoo.errors import DataError

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(d) for d in range(10))
PAD = "<pad>"
VOCABULARY = (PAD, *DIGITS, *OPERATORS, END)  # id 0 is padding
TOKEN_IDS = {token: i for i, token in enumerate(VOCABULARY)}
VALUE_PROBABILITY = 0.75  # LRA's VALUE_P = 0.25 is the probability of drawing an operator


def apply_operator(operator: str, values: list[int]) -> int:
    """One ListOps operator on its arguments' values."""
    if operator == "[MAX":
        return max(values)
    if operator == "[MIN":
        return min(values)
    if operator == "[MED":  # int(np.median(values)) in LRA: the mean of the middle two, rounded down
        ordered, middle = sorted(values), len(values) // 2
        return ordered[middle] if len(values) % 2 else (ordered[middle - 1] + ordered[middle]) // 2
    if operator == "[SM":
        return sum(values) % 10
    raise DataError(f"unknown ListOps operator {operator!r}; valid choices: {list(OPERATORS)}")


def evaluate_listops(expression: str | list[str] | tuple[str, ...]) -> int:
    """The value of an expression (a string of space-separated tokens, or its tokens)."""
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for position, token in enumerate(tokens):
        if token in OPERATORS:
            stack.append((token, []))
        elif token == END or token in DIGITS:
            if token == END:
                if not stack or not stack[-1][1]:
                    raise DataError(f"ListOps expression has an unmatched or empty ']' at token {position}")
                operator, values = stack.pop()
                value = apply_operator(operator, values)
            else:
                value = int(token)
            if stack:
                stack[-1][1].append(value)
            elif result is None and position == len(tokens) - 1:
                result = value
            else:
                raise DataError(f"ListOps expression continues after its end at token {position}")
        else:
            raise DataError(f"unknown ListOps token {token!r} at {position}; valid choices: {list(VOCABULARY[1:])}")
    if stack or result is None:
        raise DataError(f"ListOps expression is incomplete: {len(stack)} operator(s) are not closed")
    return result


class TreeTooLong(Exception):
    """A tree outgrew max_length: it is rejected, so the rest of it need not be drawn."""


def generate_tree(
    rng: random.Random, max_depth: int, max_args: int, max_length: int | None = None
) -> tuple[list[str], int]:
    """One random expression (LRA's generate_tree) as (tokens, value). With max_length, a tree that grows past
    it is abandoned (raises TreeTooLong): rejection sampling would discard it anyway, and big trees are most of
    the cost; a tree that fits is the one drawn without the limit."""
    tokens: list[str] = []

    def emit(token: str) -> None:
        tokens.append(token)
        if max_length is not None and len(tokens) > max_length:
            raise TreeTooLong

    def node(depth: int) -> int:
        if depth >= max_depth or rng.random() < VALUE_PROBABILITY:
            value = rng.randrange(10)
            emit(DIGITS[value])
            return value
        operator = rng.choice(OPERATORS)
        emit(operator)
        values = [node(depth + 1) for _ in range(rng.randint(2, max_args))]
        emit(END)
        return apply_operator(operator, values)

    value = node(1)
    return tokens, value


def generate_listops(
    count: int, min_length: int, max_length: int, seed: int = 0, max_depth: int = 10, max_args: int = 10
) -> list[tuple[tuple[str, ...], int]]:
    """`count` distinct (tokens, answer) pairs with min_length <= len(tokens) <= max_length, in drawing order."""
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    examples: list[tuple[tuple[str, ...], int]] = []
    attempts, limit = 0, 2000 * count + 100_000
    while len(examples) < count:
        attempts += 1
        if attempts > limit:
            raise DataError(
                f"ListOps: only {len(examples)} of {count} distinct expressions of {min_length}-{max_length} tokens "
                f"in {limit} draws (max_depth={max_depth}, max_args={max_args}); widen the length range or "
                "raise max_depth / max_args"
            )
        try:
            tokens, value = generate_tree(rng, max_depth, max_args, max_length)
        except TreeTooLong:
            continue
        key = tuple(tokens)
        if min_length <= len(key) <= max_length and key not in seen:
            seen.add(key)
            examples.append((key, value))
    return examples


def encode_listops(examples: list[tuple[tuple[str, ...], int]], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids (N, length) uint8 padded with id 0, answers (N,) int64)."""
    ids = torch.zeros(len(examples), length, dtype=torch.uint8)
    for row, (tokens, _) in enumerate(examples):
        ids[row, : len(tokens)] = torch.tensor([TOKEN_IDS[token] for token in tokens], dtype=torch.uint8)
    return ids, torch.tensor([answer for _, answer in examples], dtype=torch.long)


class ListOpsDataModule(TokenSequenceDataModule):
    """Generated ListOps batches: (token ids (B, max_length) int64 padded with id 0, answers (B,)).

    min_length null: a quarter of max_length (LRA's 500 of 2000). vocab_size, num_classes and padding_id are
    the task's; they are arguments so that the model config can read them (${data.vocab_size}).
    """

    def __init__(
        self,
        num_train: int = 20000,
        num_val: int = 1000,
        num_test: int = 1000,
        max_length: int = 2000,
        min_length: int | None = None,
        max_depth: int = 10,
        max_args: int = 10,
        seed: int = 0,
        vocab_size: int = len(VOCABULARY),
        num_classes: int = 10,
        padding_id: int = 0,
        **kwargs: Any,
    ) -> None:
        fixed = {"vocab_size": (vocab_size, len(VOCABULARY)), "num_classes": (num_classes, 10),
                 "padding_id": (padding_id, TOKEN_IDS[PAD])}  # fmt: skip
        for name, (given, value) in fixed.items():
            if given != value:
                raise DataError(f"ListOps has data.{name}={value}, got {given}")
        super().__init__(vocab_size=vocab_size, max_length=max_length, num_classes=num_classes, padding_id=padding_id,
                         **kwargs)  # fmt: skip
        sizes = {"num_train": num_train, "num_val": num_val, "num_test": num_test, "max_depth": max_depth}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise DataError(f"data.{name} must be a positive int, got {value!r}")
        min_length = max_length // 4 if min_length is None else min_length
        if not 1 <= min_length <= max_length:
            raise DataError(f"data.min_length must be in [1, max_length={max_length}], got {min_length}")
        if max_args < 2:
            raise DataError(f"data.max_args must be at least 2 (an operator takes 2 or more arguments), got {max_args}")
        self.counts = {"train": num_train, "val": num_val, "test": num_test}
        self.min_length = min_length
        self.max_depth, self.max_args, self.seed = max_depth, max_args, seed
        self.classes = DIGITS

    def build_splits(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        total = sum(self.counts.values())
        examples = generate_listops(total, self.min_length, self.max_length, self.seed, self.max_depth, self.max_args)
        splits, start = {}, 0
        for split, count in self.counts.items():
            splits[split] = encode_listops(examples[start : start + count], self.max_length)
            start += count
        return splits
