"""Routing attention's kernel against routing-transformer's KmeansAttention: forward and training step (issue 72).

Kernel level: ready q, k, v (B, H, n, D) that require grad, both modules in training mode (each updates its
centroids as in a training step), causal, zoo's default clusters ceil(sqrt(n)) and chunk n / clusters, the peer's
window matched to the chunk. The two implementations alternate in one process at one torch thread; each figure is
the minimum over --rounds of the wall time and of the thread CPU time (time.thread_time: less moved by other
jobs on a loaded host). Ratio = peer / zoo (> 1: zoo faster). Needs the peer: `pip install --no-deps
routing-transformer` (its small deps: einops, ...). Prints a markdown table.

    python experiments/routing_speed.py --lengths 2048 8192 16384 --rounds 5
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.attention import HeadLayout, TokenLayout  # noqa: E402
from zoo.attention.routing import RoutingAttention  # noqa: E402


def zoo_kernel(length: int, heads: int, dim: int) -> RoutingAttention:
    kernel = RoutingAttention(local_heads=0)  # every head routes, as routing-transformer's KmeansAttention
    kernel.setup(TokenLayout(max_length=length))
    kernel.setup_heads(HeadLayout(num_heads=heads, kv_heads=heads, head_dim=dim))
    return kernel.train()


def peer_kernel(zoo: RoutingAttention, heads: int, dim: int):
    from routing_transformer.routing_transformer import KmeansAttention

    return KmeansAttention(zoo.num_clusters, zoo.chunk, heads, dim, causal=True).train()


def step(run, q, k, v, grad, backward: bool) -> tuple[float, float]:
    """One call (and backward): (wall seconds, thread CPU seconds)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    if backward:
        out = run(q, k, v)
        torch.autograd.backward(out, grad)
    else:
        with torch.no_grad():
            run(q, k, v)
    return time.perf_counter() - wall, time.thread_time() - cpu


def measure(length: int, rounds: int, heads: int = 4, dim: int = 64, batch: int = 1) -> dict[str, float]:
    """Minimum wall and CPU seconds of zoo and the peer, forward and forward + backward, alternating."""
    torch.manual_seed(0)
    zoo = zoo_kernel(length, heads, dim)
    peer = peer_kernel(zoo, heads, dim)
    q, k, v = (torch.randn(batch, heads, length, dim, requires_grad=True) for _ in "qkv")
    grad = torch.randn(batch, heads, length, dim)
    runs = {
        "zoo": lambda q, k, v: zoo(q, k, v, causal=True)[0],
        "peer": lambda q, k, v: peer(q, k, v)[0],
    }
    best: dict[str, float] = {}
    for round_index in range(rounds + 1):  # round 0 warms up
        for backward in (False, True):
            phase = "fwd+bwd" if backward else "fwd"
            for name, run in runs.items():
                wall, cpu = step(run, q, k, v, grad, backward)
                q.grad = k.grad = v.grad = None
                if round_index:
                    for clock, seconds in (("wall", wall), ("cpu", cpu)):
                        key = f"{name} {phase} {clock}"
                        best[key] = min(best.get(key, math.inf), seconds)
    return best


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = [
        "| n | pass | zoo wall ms | peer wall ms | ratio wall | zoo cpu ms | peer cpu ms | ratio cpu |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for length in args.lengths:
        best = measure(length, args.rounds)
        for phase in ("fwd", "fwd+bwd"):
            wall, peer_wall = (best[f"{name} {phase} wall"] for name in ("zoo", "peer"))
            cpu, peer_cpu = (best[f"{name} {phase} cpu"] for name in ("zoo", "peer"))
            lines.append(
                f"| {length} | {phase} | {wall * 1e3:.1f} | {peer_wall * 1e3:.1f} | {peer_wall / wall:.2f} "
                f"| {cpu * 1e3:.1f} | {peer_cpu * 1e3:.1f} | {peer_cpu / cpu:.2f} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
