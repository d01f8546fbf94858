"""Training tokens/s on a corpus of short documents: packed with document masks vs one document per row, padded.

    python experiments/packing_speed.py                 # GPT on the lines of tiny-shakespeare, classifier on ListOps
    python experiments/packing_speed.py --quick         # one timed batch per path, tiny models (a smoke run)

GPT (causal LM): the documents are the non-empty lines of tiny-shakespeare (/work/shared/data; --quick or a
missing file: generated sentences), char tokens, a block of --block-size tokens. The sequence classifier (mean
pooling): ListOps expressions of 8 to --block-size tokens (zoo/data/listops.py). Three paths each, with the same
model and AdamW step: `padded to block` (every row one document, padded to the block, as a fixed-shape loader does),
`padded to batch` (padded to the longest document of the batch: dynamic padding), and `packed` (documents packed
first-fit into full blocks, attention and positions within each document: zoo/attention/documents.py). Only real
tokens are counted. Paths take turns for --rounds rounds; the median per path is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.reproduce import cpu_name  # noqa: E402
from zoo.data.listops import TOKEN_IDS, generate_listops  # noqa: E402
from zoo.data.sequences import pack_sequences  # noqa: E402
from zoo.models.gpt import GPT, GPTConfig  # noqa: E402
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig  # noqa: E402

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
PATHS = ("padded to block", "padded to batch", "packed")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, one timed batch per path and round")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8, help="rows per batch (documents per row when padded: 1)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    return parser.parse_args()


def gpt_documents(quick: bool, block_size: int) -> tuple[list[torch.Tensor], int]:
    """Char-token documents (each at most block_size tokens) and the vocabulary size."""
    if quick or not SHAKESPEARE.is_file():
        rng = np.random.default_rng(0)
        words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler", "in", "mind"]
        lines = [" ".join(rng.choice(words, size=int(rng.integers(2, 12)))) for _ in range(400)]
    else:
        lines = [line for line in SHAKESPEARE.read_text().splitlines() if line.strip()]
    vocabulary = {char: i for i, char in enumerate(sorted(set("".join(lines))))}
    return [torch.tensor([vocabulary[c] for c in line[:block_size]]) for line in lines], len(vocabulary)


def listops_documents(quick: bool, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    examples = generate_listops(64 if quick else 512, 8, block_size, seed=0, max_depth=4 if quick else 10)
    return [(torch.tensor([TOKEN_IDS[t] for t in tokens]), torch.tensor(answer)) for tokens, answer in examples]


def pad(documents: list[torch.Tensor], length: int, value: int = 0) -> torch.Tensor:
    return torch.stack([F.pad(d, (0, length - len(d)), value=value) for d in documents])


def gpt_batches(documents: list[torch.Tensor], rows: int, block: int, path: str) -> list[dict]:
    """Batches of one path over all documents, in order: inputs, targets (-100: not a target), document ids."""
    batches = []
    if path == "packed":  # documents in order, next fit into rows of `block` tokens
        rows_x, rows_y, rows_ids, x, y, ids = [], [], [], [], [], []
        for document in [*documents, None]:  # None: flush the last row
            if document is None or len(x) + len(document) > block:
                rows_x.append(x + [0] * (block - len(x)))
                rows_y.append(y + [-100] * (block - len(y)))
                rows_ids.append(ids + [len(set(ids))] * (block - len(ids)))  # the tail: a document of its own
                x, y, ids = [], [], []
            if document is None:
                break
            number = len(set(ids))
            x += document.tolist()
            y += document[1:].tolist() + [-100]  # the last token predicts nothing: the next document is another
            ids += [number] * len(document)
        for first in range(0, len(rows_x), rows):
            batches.append({key: torch.tensor(values[first : first + rows]) for key, values in
                            (("x", rows_x), ("y", rows_y), ("document_ids", rows_ids))})  # fmt: skip
        return batches
    for start in range(0, len(documents), rows):
        group = documents[start : start + rows]
        length = block if path == "padded to block" else max(len(d) for d in group)
        x = pad(group, length)
        y = pad([d[1:] for d in group], length, -100)
        batches.append({"x": x, "y": y})
    return batches


def real_tokens(batch: dict) -> int:
    return int((batch["y"] >= 0).sum()) if "y" in batch else int((batch["x"] > 0).sum())


def classifier_batches(samples, rows: int, block: int, path: str) -> list[dict]:
    batches = []
    if path == "packed":
        padded = [(F.pad(t, (0, block - len(t))), label) for t, label in samples]
        for start in range(0, len(padded), rows * 4):
            ids, labels, document_ids = pack_sequences(padded[start : start + rows * 4], padding_id=0)
            batches.append({"x": ids, "labels": labels, "document_ids": document_ids})
        return batches
    for start in range(0, len(samples), rows):
        group = samples[start : start + rows]
        length = block if path == "padded to block" else max(len(t) for t, _ in group)
        batches.append({"x": pad([t for t, _ in group], length), "labels": torch.stack([label for _, label in group])})
    return batches


def gpt_step(model, optimizer, batch: dict) -> None:
    logits = model(batch["x"], document_ids=batch.get("document_ids"))
    F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def classifier_step(model, optimizer, batch: dict) -> None:
    logits = model(batch["x"], document_ids=batch.get("document_ids"))
    F.cross_entropy(logits, batch["labels"]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(step, model, batches: dict[str, list[dict]], steps: int, rounds: int) -> dict[str, float]:
    """Median real tokens/s of each path over `rounds` turns of `steps` batches (one untimed warm-up batch)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rates: dict[str, list[float]] = {path: [] for path in batches}
    for _ in range(rounds):
        for path, path_batches in batches.items():
            step(model, optimizer, path_batches[0])
            chosen = path_batches[1 : steps + 1] or path_batches[:1]
            start = time.perf_counter()
            for batch in chosen:
                step(model, optimizer, batch)
            rates[path].append(sum(real_tokens(b) for b in chosen) / (time.perf_counter() - start))
    return {path: statistics.median(values) for path, values in rates.items()}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    block = 32 if args.quick else args.block_size
    steps, rounds = (1, 1) if args.quick else (args.steps, args.rounds)
    size = {"n_layer": 1, "n_head": 2, "n_embd": 16} if args.quick else {"n_layer": 4, "n_head": 4, "n_embd": 128}
    documents, vocab = gpt_documents(args.quick, block)
    gpt = GPT(GPTConfig(vocab_size=vocab, block_size=block, dropout=0.0, **size))
    gpt_paths = {path: gpt_batches(documents, args.rows, block, path) for path in PATHS}
    samples = listops_documents(args.quick, block)
    dims = {"dim": 16, "depth": 1, "num_heads": 2} if args.quick else {"dim": 64, "depth": 2, "num_heads": 4}
    classifier = SequenceClassifier(
        SequenceClassifierConfig(vocab_size=len(TOKEN_IDS), max_length=block, padding_id=0, pool="mean", **dims)
    )
    classifier_paths = {path: classifier_batches(samples, args.rows, block, path) for path in PATHS}
    record = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "threads": args.threads,
        "quick": args.quick,
        "block_size": block,
        "gpt_mean_document_tokens": float(np.mean([len(d) for d in documents])),
        "listops_mean_tokens": float(np.mean([len(t) for t, _ in samples])),
        "tokens_per_s": {
            "gpt": measure(gpt_step, gpt, gpt_paths, steps, rounds),
            "sequence_classifier": measure(classifier_step, classifier, classifier_paths, steps, rounds),
        },
    }
    record["packed_speedup"] = {
        model: {f"packed / {path}": rates["packed"] / rates[path] for path in PATHS[:2]}
        for model, rates in record["tokens_per_s"].items()
    }
    print(json.dumps(record, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
