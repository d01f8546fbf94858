"""Additive (Bahdanau) attention on the CPU: the reference path against the fast path, side by side.

    python experiments/additive_speed.py            # the variant study's shapes; writes results/additive_speed.md
    python experiments/additive_speed.py --quick    # small shapes, one round (a smoke run)

Each shape is one attention layer (zoo.attention.MultiHeadAttention, variant=additive: projections, scores,
softmax, values) at the batch, length, heads and width of a variant-study column that runs additive attention.
Two steps are timed: a training step's forward and backward, and an inference forward (no gradient). The two
paths, ZOO_FAST_KERNELS off (torch.tanh under torch.utils.checkpoint, autograd's backward) and on
(zoo/attention/fast/additive.py), take turns for --rounds rounds on the same inputs; the median per path is
reported, with the largest difference between the paths' outputs and gradients (fp32, relative to each
tensor's largest entry).

A second table times one decoding step's scores (one query against a cache of S keys) through each path, the fast
one forced below its threshold, at row sizes either side of fast/additive.py's MIN_ROW_ELEMENTS: the measurement
that places it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.reproduce import cpu_name  # noqa: E402
from zoo.attention import MultiHeadAttention  # noqa: E402
from zoo.attention.fast import additive as fast_additive  # noqa: E402
from zoo.attention.fast import set_fast_kernels, use_fast_kernels  # noqa: E402

PAGE = Path(__file__).resolve().parent / "results" / "additive_speed.md"
# (column, batch, length, width, heads, causal): the shapes of the variant study's columns (conf/experiment/ and
# experiments/variant_study.py's overrides), one attention layer each.
SHAPES = [
    ("GPT tiny-shakespeare char (gpt_shakespeare_char)", 12, 64, 128, 4, True),
    ("ListOps <= 256 tokens, learning recipe (lra_listops)", 32, 256, 64, 4, False),
    ("MQAR 64 tokens, width 64 (mqar)", 64, 64, 64, 1, True),
    ("MQAR 64 tokens, width 128 (mqar)", 64, 64, 128, 1, True),
]
QUICK_SHAPES = [("small causal", 2, 64, 32, 2, True), ("small bidirectional", 2, 48, 32, 2, False)]
# One decoding step of the GPT column's attention (batch 1, 4 heads of 32): cache lengths whose rows (1 query x S
# keys x 32) lie either side of MIN_ROW_ELEMENTS (2^14 values: S = 512).
DECODE_KEYS = [32, 128, 512, 2048, 8192]
QUICK_DECODE_KEYS = [32, 2048]
DECODE_HEADS, DECODE_DIM, DECODE_CALLS = 4, 32, 50
PATHS = ("reference", "fast")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, one round")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per path, taken in turns")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    parser.add_argument(
        "--page", type=Path, default=None, help="the page (default: results/additive_speed.md; none with --quick)"
    )
    return parser.parse_args()


def train_step(module: MultiHeadAttention, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    out = module(x)
    return [out.detach(), *torch.autograd.grad(out, (x, *module.parameters()), grad)]


def inference_step(module: MultiHeadAttention, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [module(x)]


def timed(path: str, step, module, x, grad) -> tuple[float, list[torch.Tensor]]:
    set_fast_kernels(path == "fast")
    start = time.perf_counter()
    result = step(module, x, grad)
    return time.perf_counter() - start, result


def measure(shape: tuple, rounds: int) -> dict:
    name, batch, length, width, heads, causal = shape
    torch.manual_seed(0)
    module = MultiHeadAttention(width, heads, variant="additive", causal=causal)
    x = torch.randn(batch, length, width, requires_grad=True)
    grad = torch.randn(batch, length, width)
    record = {"column": name, "batch": batch, "length": length, "width": width, "heads": heads, "causal": causal}
    head = torch.empty(batch, heads, length, width // heads)
    record["fast_path_applies"] = fast_additive.applies(head, head)  # rows large enough (MIN_ROW_ELEMENTS)
    for mode, step in (("train", train_step), ("inference", inference_step)):
        times: dict[str, list[float]] = {path: [] for path in PATHS}
        results = {path: timed(path, step, module, x, grad)[1] for path in PATHS}  # warm-up, and the comparison
        for round_index in range(rounds):
            for path in PATHS if round_index % 2 == 0 else PATHS[::-1]:
                times[path].append(timed(path, step, module, x, grad)[0])
        for path in PATHS:
            record[f"{mode}_{path}_ms"] = 1e3 * statistics.median(times[path])
        record[f"{mode}_speedup"] = record[f"{mode}_reference_ms"] / record[f"{mode}_fast_ms"]
        record[f"{mode}_max_difference"] = max(  # relative to the largest entry of each tensor
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(results["reference"], results["fast"])
        )
    return record


def decode_step(keys: int, rounds: int) -> dict:
    """One decoding step's scores (batch 1, DECODE_HEADS heads, 1 query, `keys` keys), no gradient: the median over
    `rounds` of DECODE_CALLS calls per path, in microseconds a call. The fast path is called directly, so it runs
    below its threshold too; `fast_path_applies` says which one the kernel's dispatch takes at this size."""
    torch.manual_seed(0)
    kernel = MultiHeadAttention(DECODE_HEADS * DECODE_DIM, DECODE_HEADS, variant="additive").kernel
    q = torch.randn(1, DECODE_HEADS, 1, DECODE_DIM)
    k = torch.randn(1, DECODE_HEADS, keys, DECODE_DIM)
    paths = {
        "reference": lambda: kernel.scores(q, k),  # ZOO_FAST_KERNELS off, set below
        "fast": lambda: fast_additive.additive_scores(q, k, kernel.score_vectors, False),
    }
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    set_fast_kernels(False)
    with torch.no_grad():
        for round_index in range(rounds + 1):  # the first round warms up
            for path in PATHS if round_index % 2 == 0 else PATHS[::-1]:
                start = time.perf_counter()
                for _ in range(DECODE_CALLS):
                    paths[path]()
                if round_index:
                    times[path].append((time.perf_counter() - start) / DECODE_CALLS)
    record = {"keys": keys, "row_elements": keys * DECODE_DIM, "fast_path_applies": fast_additive.applies(q, k)}
    for path in PATHS:
        record[f"{path}_us"] = 1e6 * statistics.median(times[path])
    record["speedup"] = record["reference_us"] / record["fast_us"]
    return record


def tanh_errors() -> dict[str, float]:
    """The largest absolute error in fp32, against fp64's tanh on [-20, 20], of torch.tanh and of the fast path's
    2 sigmoid(2u) - 1."""
    u = torch.linspace(-20, 20, 100001, dtype=torch.float64)
    exact, x = torch.tanh(u), u.float()
    forms = {"torch.tanh": torch.tanh(x), "2 sigmoid(2u) - 1": 2 * torch.sigmoid(2 * x) - 1}
    return {name: (value.double() - exact).abs().max().item() for name, value in forms.items()}


def markdown(record: dict) -> str:
    lines = [
        "# Additive attention on the CPU: reference path and fast path",
        "",
        f"Written by `python experiments/additive_speed.py` on {record['date']}: {record['cpu']}, "
        f"{record['threads']} torch thread(s), torch {record['torch']}, python {record['python']}, fp32, "
        f"load average at start {record['load']}. Each row is one attention layer (`MultiHeadAttention`, "
        "`variant=additive`) at the shape of a variant-study column; the two paths take turns for "
        f"{record['rounds']} rounds on the same inputs, medians in ms. Reference: `ZOO_FAST_KERNELS=0` (torch.tanh "
        "under torch.utils.checkpoint, autograd's backward); fast: `zoo/attention/fast/additive.py`. Max diff: the "
        "largest difference between the paths' outputs and gradients (input and parameters), relative to the "
        "tensor's largest entry.",
        "",
        "| column | batch x length, width / heads | train ref | train fast | speed-up | inference ref | "
        "inference fast | speed-up | max diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        shape = f"{row['batch']} x {row['length']}, {row['width']} / {row['heads']}" + (
            " causal" if row["causal"] else ""
        )
        difference = max(row["train_max_difference"], row["inference_max_difference"])
        lines.append(
            f"| {row['column']} | {shape} | {row['train_reference_ms']:.1f} | {row['train_fast_ms']:.1f} | "
            f"{row['train_speedup']:.2f}x | {row['inference_reference_ms']:.1f} | {row['inference_fast_ms']:.1f} | "
            f"{row['inference_speedup']:.2f}x | {difference:.1e} |"
        )
    errors = "; ".join(f"{name} {error:.1e}" for name, error in record["tanh_errors"].items())
    lines += [
        "",
        f"One decoding step's scores (`kernel.scores`, no gradient): batch 1, {DECODE_HEADS} heads of {DECODE_DIM}, "
        f"one query against S cached keys; median of {record['rounds']} rounds of {DECODE_CALLS} calls, microseconds "
        "a call; the fast path called directly, so it runs below its threshold too. A row holds 1 x S x "
        f"{DECODE_DIM} values; rows under MIN_ROW_ELEMENTS = {record['min_row_elements']} take the reference path "
        "(last column).",
        "",
        "| S keys | row values | reference | fast | speed-up | path taken |",
        "|---|---|---|---|---|---|",
    ]
    for row in record["decode"]:
        taken = "fast" if row["fast_path_applies"] else "reference"
        lines.append(
            f"| {row['keys']} | {row['row_elements']} | {row['reference_us']:.0f} | {row['fast_us']:.0f} | "
            f"{row['speedup']:.2f}x | {taken} |"
        )
    lines += ["", f"tanh in fp32, largest absolute error against fp64 on [-20, 20]: {errors}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    rounds = 1 if args.quick else args.rounds
    before = use_fast_kernels()
    try:
        rows = []
        for shape in QUICK_SHAPES if args.quick else SHAPES:
            rows.append(measure(shape, rounds))
            print(json.dumps(rows[-1]), flush=True)
        decode = [decode_step(keys, rounds) for keys in (QUICK_DECODE_KEYS if args.quick else DECODE_KEYS)]
        print(json.dumps(decode), flush=True)
    finally:
        set_fast_kernels(before)
    record = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "rounds": rounds,
        "rows": rows,
        "decode": decode,
        "min_row_elements": fast_additive.MIN_ROW_ELEMENTS,
        "tanh_errors": tanh_errors(),
    }
    page = args.page or (None if args.quick else PAGE)
    if page is not None:
        page.write_text(markdown(record))
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
