"""zoo's efficient attention against the public implementations a researcher would otherwise pick (issue #72).

    python experiments/peers.py [--lengths 2048 8192 16384] [--rounds 5] [--pairs lsh favor] [--out DIR]

Each pair runs in one process on the same inputs, the two implementations alternating within every round (the
order flips each round), the minimum of --rounds calls each; one torch thread, B=1, H=4, head dim 64, fp32. Time
is measured twice per call, wall clock and the CPU time of the computing thread (time.thread_time, which time
spent waiting for a core does not inflate); ratio = peer time / zoo time (> 1: zoo faster). Forward: eval mode,
no_grad. Forward + backward: train mode, out.sum().backward() with gradients of the inputs and the weights.

    lsh         zoo lsh kernel, 4 rounds, chunks of 64, n / 64 buckets, causal, vs reformer_pytorch LSHAttention
                (bucket_size 64, n_hashes 4, causal): shared QK, heads folded into the batch for the peer
    routing     zoo routing kernel (clusters ceil(sqrt(n)), chunks ceil(n / clusters)), causal, vs
                routing_transformer KmeansAttention (the same clusters, window_size = the chunk), causal
    local       zoo local kernel, window 256, causal, vs local_attention.LocalAttention (window_size 256,
                causal, exact_windowsize: 257 keys, zoo's 256)
    compressed  zoo MultiHeadAttention variant compressed (k = 256) vs linformer LinformerSelfAttention (k = 256),
                model dim 256: modules with their projections; the peer's weights are copied from zoo's (no bias
                on q, k, v; E and F shared by the heads), so the two compute the same function
    favor       zoo linear kernel with FAVOR+ features (266 = d ln d), bidirectional, vs performer_pytorch
                FastAttention (the same 266 features: zoo's projection copied into it)

Quality: the mean over every output row of its cosine to exact softmax attention on the same inputs, each
implementation on its own (eval mode; a zero row counts 0): for lsh, shared-QK exact attention (keys q / |q|, a
token attends to itself only when nothing else is visible, as both LSH kernels do); for compressed, zoo's full
attention module with the same weights; otherwise softmax(q k^T / sqrt(d)) v, causal where the pair is. Beside
them, uniform attention's cosine (each row the mean of the values it may see): what attending to nothing in
particular scores on the same inputs. Inputs: standard Gaussian q, k, v (x for the modules), seed 0: unstructured keys.

Writes experiments/results/peers.{md,json}.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.attention_benchmark import machine_info  # noqa: E402
from experiments.lsh_chunk_keys import mean_cosine  # noqa: E402
from zoo.attention import MultiHeadAttention, TokenLayout  # noqa: E402
from zoo.attention.fast import use_fast_kernels  # noqa: E402

HEADS, HEAD_DIM = 4, 64
DIM = HEADS * HEAD_DIM
LSH_HASHES, LSH_CHUNK, WINDOW, COMPRESSED_LENGTH = 4, 64, 256, 256
PAIRS = ("lsh", "routing", "local", "compressed", "favor")
PEER_PACKAGES = {  # pair -> (the peer's module, the pip distribution the extra `peers` pins)
    "lsh": ("reformer_pytorch", "reformer-pytorch"),
    "routing": ("routing_transformer", "routing-transformer"),
    "local": ("local_attention", "local-attention"),
    "compressed": ("linformer", "linformer"),
    "favor": ("performer_pytorch", "performer-pytorch"),
}
MODES = ("forward", "train")  # train: forward + backward
EXACT_BLOCK = 1024  # query rows per block of the exact reference (its scores never take n x n at once)
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Pair:
    """zoo's implementation and the peer's on the same inputs, and the exact attention both approximate."""

    name: str
    title: str
    zoo: Callable[..., torch.Tensor]
    peer: Callable[..., torch.Tensor]
    exact: Callable[..., torch.Tensor]
    inputs: Callable[[bool], tuple[torch.Tensor, ...]]  # requires_grad -> the arguments of zoo, peer and exact
    modules: list[torch.nn.Module] = field(default_factory=list)  # set to train / eval with the mode
    causal: bool | None = None  # ready q, k, v: causal or not (None: a module on x)


def gaussian_qkv(length: int) -> Callable[[bool], tuple[torch.Tensor, ...]]:
    def make(requires_grad: bool) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(0)
        shape = (1, HEADS, length, HEAD_DIM)
        return tuple(torch.randn(shape, generator=generator).requires_grad_(requires_grad) for _ in range(3))

    return make


def exact_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, shared_qk: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, (B, H, n, D), a block of query rows at a time. shared_qk: the keys are q / |q|
    and a token attends to itself only when nothing else is visible (the first causal row)."""
    if not shared_qk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    keys = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    length = q.shape[2]
    columns = torch.arange(length)
    blocks = []
    for start in range(0, length, EXACT_BLOCK):
        rows = torch.arange(start, min(start + EXACT_BLOCK, length))[:, None]
        hidden = (columns > rows) if causal else torch.zeros(rows.shape[0], length, dtype=torch.bool)
        hidden = hidden | ((columns == rows) & ~(causal & (rows == 0)))  # self, unless it is all there is
        scores = q[:, :, rows[:, 0]] @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
        blocks.append(torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v)
    return torch.cat(blocks, dim=2)


def lsh_pair(length: int) -> Pair:
    from reformer_pytorch import LSHAttention as ReformerLSH

    zoo = MultiHeadAttention(
        DIM, HEADS, variant="lsh", hashes=LSH_HASHES, chunk_size=LSH_CHUNK, layout=TokenLayout(max_length=length)
    ).kernel
    peer = ReformerLSH(bucket_size=LSH_CHUNK, n_hashes=LSH_HASHES, causal=True)

    def reformer(q, k, v):  # shared QK: k unused, as in zoo's kernel; heads folded into the batch
        batch, heads, n, dim = q.shape
        out = peer(q.reshape(batch * heads, n, dim), v.reshape(batch * heads, n, dim))[0]
        return out.view(batch, heads, n, dim)

    return Pair(
        name="lsh",
        title=f"lsh ({LSH_HASHES} rounds) vs reformer-pytorch LSHAttention",
        zoo=lambda q, k, v: zoo(q, k, v, causal=True)[0],
        peer=reformer,
        exact=lambda q, k, v: exact_attention(q, k, v, causal=True, shared_qk=True),
        inputs=gaussian_qkv(length),
        modules=[zoo, peer],
        causal=True,
    )


def routing_pair(length: int) -> Pair:
    from routing_transformer.routing_transformer import KmeansAttention

    # every head routes, as in KmeansAttention (zoo's default makes half the heads local)
    zoo = MultiHeadAttention(DIM, HEADS, variant="routing", local_heads=0, layout=TokenLayout(max_length=length)).kernel
    peer = KmeansAttention(zoo.num_clusters, zoo.chunk, HEADS, HEAD_DIM, causal=True)
    return Pair(
        name="routing",
        title="routing vs routing-transformer KmeansAttention",
        zoo=lambda q, k, v: zoo(q, k, v, causal=True)[0],
        peer=lambda q, k, v: peer(q, k, v)[0],  # (out, the k-means commitment loss)
        exact=lambda q, k, v: exact_attention(q, k, v, causal=True),
        inputs=gaussian_qkv(length),
        modules=[zoo, peer],
        causal=True,
    )


def local_pair(length: int) -> Pair:
    from local_attention import LocalAttention as PeerLocal

    zoo = MultiHeadAttention(DIM, HEADS, variant="local", window=WINDOW).kernel
    peer = PeerLocal(window_size=WINDOW, causal=True, exact_windowsize=True)
    return Pair(
        name="local",
        title=f"local({WINDOW}) vs local-attention",
        zoo=lambda q, k, v: zoo(q, k, v, causal=True)[0],
        peer=peer,
        exact=lambda q, k, v: exact_attention(q, k, v, causal=True),
        inputs=gaussian_qkv(length),
        modules=[zoo, peer],
        causal=True,
    )


def compressed_pair(length: int) -> Pair:
    from linformer import LinformerSelfAttention

    torch.manual_seed(0)
    options = dict(qkv_bias=False, bias=True)
    zoo = MultiHeadAttention(
        DIM, HEADS, variant="compressed", compressed_length=COMPRESSED_LENGTH, layout=TokenLayout(max_length=length),
        **options,
    )  # fmt: skip
    full = MultiHeadAttention(DIM, HEADS, **options)
    full.load_state_dict({name: p for name, p in zoo.state_dict().items() if not name.startswith("kernel.")})
    peer = LinformerSelfAttention(DIM, length, k=COMPRESSED_LENGTH, heads=HEADS)
    with torch.no_grad():  # the same function: zoo's weights in the peer's layout
        for target, weight in zip((peer.to_q, peer.to_k, peer.to_v), zoo.in_proj.weight.split(DIM)):
            target.weight.copy_(weight)
        peer.to_out.load_state_dict(zoo.out_proj.state_dict())
        peer.proj_k.copy_(zoo.kernel.key_projection.T)
        peer.proj_v.copy_(zoo.kernel.value_projection.T)

    def inputs(requires_grad: bool) -> tuple[torch.Tensor]:
        x = torch.randn(1, length, DIM, generator=torch.Generator().manual_seed(0))
        return (x.requires_grad_(requires_grad),)

    return Pair(
        name="compressed",
        title=f"compressed vs linformer (k={COMPRESSED_LENGTH}, with projections)",
        zoo=zoo,
        peer=peer,
        exact=full,
        inputs=inputs,
        modules=[zoo, peer, full],
    )


def favor_pair(length: int) -> Pair:
    from performer_pytorch import FastAttention

    zoo = MultiHeadAttention(DIM, HEADS, variant="linear", feature_map="favor").kernel
    features = zoo.projection.shape[0]
    peer = FastAttention(HEAD_DIM, nb_features=features, causal=False)
    peer.projection_matrix.copy_(zoo.projection)
    return Pair(
        name="favor",
        title=f"FAVOR+ bidirectional ({features} features) vs performer-pytorch",
        zoo=lambda q, k, v: zoo(q, k, v)[0],
        peer=peer,
        exact=lambda q, k, v: exact_attention(q, k, v, causal=False),
        inputs=gaussian_qkv(length),
        modules=[zoo, peer],
        causal=False,
    )


BUILDERS = {
    "lsh": lsh_pair,
    "routing": routing_pair,
    "local": local_pair,
    "compressed": compressed_pair,
    "favor": favor_pair,
}


def step(fn: Callable, inputs: tuple[torch.Tensor, ...], mode: str) -> None:
    if mode == "forward":
        with torch.no_grad():
            fn(*inputs)
        return
    fn(*inputs).sum().backward()


def clear_gradients(pair: Pair, inputs: tuple[torch.Tensor, ...]) -> None:
    for x in inputs:
        x.grad = None
    for module in pair.modules:
        module.zero_grad(set_to_none=True)


def time_pair(pair: Pair, mode: str, rounds: int) -> dict[str, dict[str, float]]:
    """{'zoo' | 'peer': {'wall_ms', 'cpu_ms'}}: the minimum over `rounds` calls, the two alternating, after one
    warm-up call each (caches, allocator, the peer's k-means initialisation)."""
    for module in pair.modules:
        module.train(mode == "train")
    inputs = pair.inputs(mode == "train")
    sides = {"zoo": pair.zoo, "peer": pair.peer}
    times: dict[str, dict[str, list[float]]] = {side: {"wall": [], "cpu": []} for side in sides}
    for fn in sides.values():
        step(fn, inputs, mode)
        clear_gradients(pair, inputs)
    for index in range(rounds):
        for side in ("zoo", "peer") if index % 2 == 0 else ("peer", "zoo"):
            torch.manual_seed(index)  # the peers' and zoo's training hashes draw from the global generator
            wall, cpu = time.perf_counter(), time.thread_time()
            step(sides[side], inputs, mode)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            clear_gradients(pair, inputs)
            times[side]["wall"].append(wall)
            times[side]["cpu"].append(cpu)
    return {side: {f"{clock}_ms": 1e3 * min(t[clock]) for clock in ("wall", "cpu")} for side, t in times.items()}


def uniform_attention(v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Every row the mean of the values it may see: attention to nothing in particular, for reference."""
    if not causal:
        return v.mean(dim=2, keepdim=True).expand_as(v)
    return v.cumsum(dim=2) / torch.arange(1, v.shape[2] + 1, dtype=v.dtype)[:, None]


def quality(pair: Pair) -> dict[str, float]:
    """Mean cosine of each side's output rows to exact attention (eval mode, the same inputs), and of uniform
    attention's for reference (ready q, k, v only: the modules' values are inside them)."""
    for module in pair.modules:
        module.eval()
    inputs = pair.inputs(False)
    with torch.no_grad():
        exact = pair.exact(*inputs)
        torch.manual_seed(0)
        cosines = {side: mean_cosine(getattr(pair, side)(*inputs), exact) for side in ("zoo", "peer")}
        if pair.causal is not None:
            cosines["uniform"] = mean_cosine(uniform_attention(inputs[2], pair.causal), exact)
        return cosines


def measure(pairs: list[str], lengths: list[int], rounds: int, log: Callable[[str], None]) -> list[dict]:
    records = []
    for length in lengths:
        for name in pairs:
            torch.manual_seed(0)  # the same weights, centroids and random features in every run
            pair = BUILDERS[name](length)
            record = {"pair": name, "title": pair.title, "length": length, "quality": quality(pair)}
            for mode in MODES:
                record[mode] = time_pair(pair, mode, rounds)
                times = record[mode]
                for clock in ("wall", "cpu"):
                    times[f"{clock}_ratio"] = times["peer"][f"{clock}_ms"] / times["zoo"][f"{clock}_ms"]
            log(
                f"n={length} {name}: fwd / fwd+bwd {ratio_cell(record, 'wall')} (wall), {ratio_cell(record, 'cpu')} "
                f"(thread CPU); cosine zoo / peer (uniform) {cosine_cell(record['quality'])}"
            )
            records.append(record)
    return records


def cpu_model() -> str:
    """lscpu's model name (the CPU the figures were measured on); /proc/cpuinfo's where lscpu is missing."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return machine_info()["CPU"]


def conditions(rounds: int) -> dict[str, str]:
    info = machine_info()
    info["lscpu model name"] = cpu_model()
    info["zoo fast kernels"] = "on" if use_fast_kernels() else "off (ZOO_FAST_KERNELS=0)"
    info["rounds"] = f"{rounds} (minimum taken)"
    for _module, distribution in PEER_PACKAGES.values():
        try:
            info[distribution] = version(distribution)
        except PackageNotFoundError:  # a missing peer is stated, not fatal
            info[distribution] = "not installed"
    return info


def ratio_cell(record: dict, clock: str) -> str:
    return f"{record['forward'][f'{clock}_ratio']:.2f} / {record['train'][f'{clock}_ratio']:.2f}"


def cosine_cell(quality: dict[str, float]) -> str:
    uniform = f" ({quality['uniform']:.3f})" if "uniform" in quality else ""
    return f"{quality['zoo']:.3f} / {quality['peer']:.3f}{uniform}"


def notes(records: list[dict], info: dict[str, str], load_after: str) -> list[str]:
    """What a reader needs to read the tables: which clock to trust on a loaded host, and why a peer's cosine is
    what it is where that is not the pair's own doing."""
    lines = []
    loads = [float(x) for text in (info.get("load average at start", ""), load_after) for x in text.split()[:1]]
    if loads and max(loads) > os.cpu_count():
        lines.append(
            f"- The load average ({max(loads):.1f}) exceeded the {os.cpu_count()} cores during the run: wall times "
            "include waiting for a core, so read the thread-CPU ratios (the two sides alternate, so both wait alike, "
            "but the minimum of a few rounds does not remove it)."
        )
    if any(r["pair"] == "favor" for r in records):
        lines.append(
            "- FAVOR+'s cosine: performer-pytorch adds eps = 1e-4 to every feature after dividing the keys by their "
            "largest feature over the whole sequence (its `softmax_kernel`); on these inputs that constant outweighs "
            "most key features, and its output is close to uniform attention (its cosine is the bracketed one's). "
            "With eps = 0 it computes zoo's output (checked 2026-12-08 at n=2048: cosine 1.000 between the two). "
            "zoo's estimate is the unbiased one (tests/attention/test_favor_unbiased.py), and with 266 features it "
            "is noisy on keys this spread out."
        )
    if any(r["pair"] == "routing" for r in records):
        lines.append(
            "- Routing's cosine: routing-transformer initialises its centroids by k-means on its first batch (here "
            "the measured inputs) and gives each cluster a memory key and value (parameters; random here); zoo's "
            "routing kernel as built here starts from random centroids (issue #72)."
        )
    return lines


def write_page(records: list[dict], info: dict[str, str], path: Path, load_after: str) -> None:
    lengths = sorted({r["length"] for r in records})
    names = [name for name in PAIRS if any(r["pair"] == name for r in records)]
    cell = {(r["pair"], r["length"]): r for r in records}
    titles = {r["pair"]: r["title"] for r in records}
    lines = ["# zoo against the peers' implementations", "", "Written by `python experiments/peers.py` "
             f"(lengths {' '.join(map(str, lengths))}); method and pairs in its docstring.", ""]  # fmt: skip
    lines += ["| | |", "|---|---|"] + [f"| {key} | {value} |" for key, value in info.items()]
    lines += [f"| load average at the end | {load_after} |", ""]
    header = "| comparison | " + " | ".join(f"n={n} speed | n={n} cosine zoo / peer (uniform)" for n in lengths) + " |"
    rule = "|---|" + "---|---|" * len(lengths)
    for clock, label in (("wall", "wall clock"), ("cpu", "thread CPU time")):
        lines += [f"## Ratio peer time / zoo time, forward / forward + backward ({label}; > 1: zoo faster)", ""]
        lines += [header, rule]
        for name in names:
            row = [f"| {titles[name]} |"]
            for n in lengths:
                r = cell.get((name, n))
                row.append(
                    " - | - |" if r is None
                    else f" {ratio_cell(r, clock)} | {cosine_cell(r['quality'])} |"
                )  # fmt: skip
            lines.append("".join(row))
        lines.append("")
    lines += [
        "## Times (ms, minimum of the rounds)", "",
        "| pair | n | zoo fwd wall | peer fwd wall | zoo fwd+bwd wall | peer fwd+bwd wall | zoo fwd CPU | "
        "peer fwd CPU | zoo fwd+bwd CPU | peer fwd+bwd CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in records:
        values = [
            r[mode][side][f"{clock}_ms"] for clock in ("wall", "cpu") for mode in MODES for side in ("zoo", "peer")
        ]
        lines.append(f"| {r['pair']} | {r['length']} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    lines += [
        "",
        "Quality: mean cosine of the output rows to exact attention on the same unstructured (Gaussian) inputs; "
        "see the docstring for each pair's exact reference. In brackets, uniform attention's (each row the mean of "
        "the values it may see): what attending to nothing in particular scores on these inputs. The "
        "cosine says how much of exact attention each implementation keeps here, not how well it trains.",
    ]
    remarks = notes(records, info, load_after)
    lines += ["", "Notes:", *remarks] if remarks else []
    path.write_text("\n".join(lines) + "\n")


def check_peers(pairs: list[str]) -> None:
    """A clear message for a peer that is not installed (they are the optional extra `peers`)."""
    missing = []
    for name in pairs:
        module, distribution = PEER_PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError as error:  # not installed, or one of its own imports missing
            missing.append(f"{distribution} ({error})")
    if missing:
        command = "pip install --no-deps -r experiments/peers-requirements.txt"
        raise SystemExit(f"experiments/peers.py needs {', '.join(missing)}: {command}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=5, help="calls of each implementation; the minimum is kept")
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of peers.md and peers.json")
    args = parser.parse_args(argv)
    check_peers(args.pairs)
    torch.set_num_threads(1)
    info = conditions(args.rounds)
    print(" | ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    records = measure(args.pairs, args.lengths, args.rounds, lambda line: print(line, flush=True))
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    args.out.mkdir(parents=True, exist_ok=True)
    write_page(records, info, args.out / "peers.md", load_after)
    record = {"conditions": {**info, "load average at the end": load_after}, "results": records}
    (args.out / "peers.json").write_text(json.dumps(record, indent=1) + "\n")
    return records


if __name__ == "__main__":
    main()
