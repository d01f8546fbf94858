"""How close LSH attention comes to exact attention under each `attention.chunk_keys` (zoo/attention/lsh.py).

Unstructured inputs: random Gaussian queries (the keys are the normalised queries: shared QK) and values. For
each setting, rounds and causality, the mean over rows of the cosine between LSH's output row and exact
shared-QK attention's (a token attends to itself only when nothing else is visible, as in LSH), with the kernel's
forward time beside it (one torch thread, the fastest of --repeats). Reformer's own pattern (the whole sequence
sorted by bucket, cut into chunks, each seeing itself and the previous chunk) is given densely for comparison,
bidirectional only (causal, its chunks depend on later tokens). Prints a markdown table.

    python experiments/lsh_chunk_keys.py --length 2048 --rounds 4 8
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.attention import TokenLayout  # noqa: E402
from zoo.attention.clustered import exclude_self  # noqa: E402
from zoo.attention.lsh import LSHAttention, lsh_buckets  # noqa: E402


def exact_attention(q: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Shared-QK softmax attention over every key, self only when nothing else is visible: (B, H, n, D)."""
    length = q.shape[2]
    keys = q / q.norm(dim=-1, keepdim=True)
    allowed = torch.ones(length, length, dtype=torch.bool)
    allowed = allowed.tril() if causal else allowed
    allowed = exclude_self(allowed, torch.eye(length, dtype=torch.bool))
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def reformer_attention(q: torch.Tensor, v: torch.Tensor, kernel: LSHAttention) -> torch.Tensor:
    """Reformer's bidirectional pattern, densely: per round and row, sort by (bucket, position), chunks of
    chunk_size, each chunk sees itself and the previous one (the first: the last, as reformer-pytorch wraps)."""
    batch, heads, length, dim = q.shape
    keys = q / q.norm(dim=-1, keepdim=True)
    scores = q @ keys.transpose(-2, -1) / math.sqrt(dim)
    buckets = lsh_buckets(q, kernel.rotations(heads, dim, q.device))  # (R, B, H, n)
    positions = torch.arange(length)
    chunks = length // kernel.chunk_size
    outs, lses = [], []
    for round_buckets in buckets:
        order = (round_buckets * length + positions).argsort(dim=-1)
        sorted_index = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))
        chunk = sorted_index // kernel.chunk_size
        same = chunk[..., :, None] == chunk[..., None, :]
        allowed = same | (chunk[..., None, :] == (chunk[..., :, None] - 1) % chunks)
        allowed = exclude_self(allowed, torch.eye(length, dtype=torch.bool))
        masked = scores.masked_fill(~allowed, float("-inf"))
        lses.append(torch.logsumexp(masked, dim=-1))
        outs.append(torch.softmax(masked, dim=-1) @ v)
    weights = torch.softmax(torch.stack(lses), dim=0)
    return (weights[..., None] * torch.stack(outs)).sum(dim=0)


def mean_cosine(out: torch.Tensor, exact: torch.Tensor) -> float:
    return F.cosine_similarity(out, exact, dim=-1).mean().item()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--rounds", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="forward timings per cell; the fastest is shown")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, args.heads, args.length, args.dim, generator=generator)
    v = torch.randn(1, args.heads, args.length, args.dim, generator=generator)
    lines = [
        f"n={args.length}, heads={args.heads}, head dim={args.dim}, chunk_size={args.chunk_size}, buckets ~ n / chunk",
        "",
        "| attention | rounds | chunk_keys | mean cosine to exact | forward ms |",
        "|---|---|---|---|---|",
    ]
    for causal in (False, True):
        exact = exact_attention(q, v, causal)
        for rounds in args.rounds:
            for chunk_keys in ("bucket", "chunk"):
                kernel = LSHAttention(hashes=rounds, chunk_size=args.chunk_size, chunk_keys=chunk_keys)
                kernel.setup(TokenLayout(max_length=args.length))
                kernel.eval()
                times = []
                with torch.no_grad():
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        out, _ = kernel(q, q, v, causal=causal)
                        times.append(time.perf_counter() - start)
                name = "causal" if causal else "bidirectional"
                lines.append(
                    f"| {name} | {rounds} | {chunk_keys} | {mean_cosine(out, exact):.3f} | {1e3 * min(times):.0f} |"
                )
            if not causal:
                reformer = reformer_attention(q, v, kernel)
                lines.append(
                    f"| bidirectional | {rounds} | Reformer's sort (dense) | {mean_cosine(reformer, exact):.3f} | |"
                )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
