"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", section 3): the synthetic task that
separates attention from its efficient substitutes. A sequence opens with `num_kv_pairs` key-value pairs
(`k1 v1 k2 v2 ...`, keys distinct), then the keys come back as queries at random later positions, among random
filler tokens; at each query the model must predict, as the next token, the value paired with that key.
Accuracy is counted on the queries only (every other target is IGNORE).

As Zoology's generator: keys from the lower half of the vocabulary, values from the upper half (token 0
excluded), the query positions drawn with a power law over the gaps (small gaps more likely; `power_a`), the
positions that hold no query filled with random tokens. The examples are (inputs, targets) of a causal language
model: inputs = sequence[:-1], targets = sequence[1:] with IGNORE wherever the next token is not a queried value.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from zoo.data.splits import SplitDataModule
from zoo.errors import DataError

IGNORE = -100  # the target of a position that is not scored (torch cross_entropy's ignore_index)


def check_mqar(seq_len: int, num_kv_pairs: int, vocab_size: int) -> None:
    """One-line errors for settings that cannot hold a sequence (Zoology's asserts, with the fix named)."""
    for name, value in (("seq_len", seq_len), ("num_kv_pairs", num_kv_pairs), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise DataError(f"data.{name} must be a positive int, got {value!r}")
    if seq_len + 1 < 4 * num_kv_pairs:
        raise DataError(f"data.seq_len={seq_len} is too short for {num_kv_pairs} key-value pairs and their queries; "
                        f"use data.seq_len >= {4 * num_kv_pairs - 1}")  # fmt: skip
    if vocab_size // 2 - 1 < num_kv_pairs:
        raise DataError(f"data.vocab_size={vocab_size} has too few keys for {num_kv_pairs} distinct ones; "
                        f"use data.vocab_size >= {2 * num_kv_pairs + 2}")  # fmt: skip


def generate_mqar(
    num_examples: int,
    seq_len: int,
    num_kv_pairs: int,
    vocab_size: int = 8192,
    power_a: float = 0.01,
    random_non_queries: bool = True,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (num_examples, seq_len) int64: see the module docstring. Seeded: the same
    arguments give the same examples."""
    check_mqar(seq_len, num_kv_pairs, vocab_size)
    rng = np.random.default_rng(seed)
    context = 2 * num_kv_pairs
    keys_from = np.arange(1, vocab_size // 2)
    values_from = np.arange(vocab_size // 2, vocab_size)
    keys = np.stack([rng.choice(keys_from, num_kv_pairs, replace=False) for _ in range(num_examples)])
    values = np.stack([rng.choice(values_from, num_kv_pairs, replace=True) for _ in range(num_examples)])
    pairs = np.zeros((num_examples, context), dtype=np.int64)
    pairs[:, 0::2], pairs[:, 1::2] = keys, values
    # Queries sit at even offsets of the rest (a key then its value), gaps drawn by a power law: p(gap) ~ gap^(a-1).
    slots = (seq_len + 1 - context) // 2
    gaps = np.arange(1, slots + 1)
    weights = power_a * gaps ** (power_a - 1.0)
    weights /= weights.sum()
    offsets = np.stack([rng.choice(slots, num_kv_pairs, replace=False, p=weights) for _ in range(num_examples)]) * 2
    rest = np.zeros((num_examples, seq_len + 1 - context), dtype=np.int64)
    rows = np.arange(num_examples)[:, None]
    rest[rows, offsets], rest[rows, offsets + 1] = keys, values
    answers = np.zeros_like(rest, dtype=bool)
    answers[rows, offsets + 1] = True
    sequence = np.concatenate([pairs, rest], axis=1)  # (N, seq_len + 1)
    scored = np.concatenate([np.zeros((num_examples, context), dtype=bool), answers], axis=1)
    inputs, targets = sequence[:, :-1].copy(), sequence[:, 1:].copy()
    targets[~scored[:, 1:]] = IGNORE
    if random_non_queries:  # the empty positions: random tokens, so that position alone says nothing
        filler = rng.integers(0, vocab_size, size=inputs.shape)
        empty = inputs == 0
        inputs[empty] = filler[empty]
    return torch.from_numpy(inputs), torch.from_numpy(targets)


class MQARDataModule(SplitDataModule):
    """Generated MQAR batches (inputs (B, seq_len), targets (B, seq_len) with IGNORE off the queries) for a causal
    model. The train, val and test examples are drawn from three different seeds (seed, seed + 1, seed + 2) and
    the val and test examples whose key-value context also occurs in training are dropped: disjoint splits.

    Args:
        seq_len: tokens a model reads (Zoology: 64-512).
        num_kv_pairs: key-value pairs per sequence, each queried once (Zoology: 4-64).
        vocab_size: keys from the lower half, values from the upper half (Zoology: 8192).
        num_train, num_val, num_test: examples per split (before dropping val/test overlaps with train).
        power_a: the power law of the query gaps (Zoology: 0.01).
        seed: the train split's seed; val and test take the next two.
        batch_size, eval_batch_size, num_workers: the loaders'.
    """

    def __init__(
        self,
        seq_len: int = 64,
        num_kv_pairs: int = 4,
        vocab_size: int = 8192,
        num_train: int = 10000,
        num_val: int = 500,
        num_test: int = 1000,
        power_a: float = 0.01,
        seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        check_mqar(seq_len, num_kv_pairs, vocab_size)
        self.seq_len, self.num_kv_pairs, self.vocab_size, self.power_a, self.seed = (
            seq_len, num_kv_pairs, vocab_size, power_a, seed)  # fmt: skip
        self.counts = {"train": num_train, "val": num_val, "test": num_test}
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers = num_workers
        self.block_size = seq_len  # what a causal model's context must hold
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        settings = (self.seq_len, self.num_kv_pairs, self.vocab_size, self.power_a)
        drawn = {split: generate_mqar(count, *settings, seed=self.seed + i)
                 for i, (split, count) in enumerate(self.counts.items())}  # fmt: skip
        context = 2 * self.num_kv_pairs
        seen = {tuple(row) for row in drawn["train"][0][:, :context].tolist()}
        for split, (inputs, targets) in drawn.items():
            if split != "train":
                keep = torch.tensor([tuple(row) not in seen for row in inputs[:, :context].tolist()], dtype=torch.bool)
                inputs, targets = inputs[keep], targets[keep]
            self.splits[split] = TensorDataset(inputs, targets)

    def loader(self, split: str) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.batch_size_of(split), shuffle=split == "train",
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)  # fmt: skip
