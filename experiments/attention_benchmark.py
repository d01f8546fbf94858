"""Speed and memory of zoo's attention variants against bare scaled_dot_product_attention.

    python experiments/attention_benchmark.py [--quick]

Self-attention, B=1, H=4, head dim 64 (model dim 256), fp32, sequence lengths 256..32768 (--quick: up
to 8192), on the CPU and, when present, CUDA. Causal rows:

    sdpa        F.scaled_dot_product_attention(q, k, v, is_causal=True) on ready (B, H, T, D) tensors
    sdpa+proj   the least a module can cost: in_proj -> sdpa -> out_proj, written out by hand
    full        zoo MultiHeadAttention, variant full
    rope        full with rotary positions
    alibi, t5   full with a position bias: ALiBi (Press et al. 2022), T5's learned buckets (32, max distance 128)
    local       variant local, window 256
    linear      variant linear (Katharopoulos et al. 2020)
    sparse      variant sparse, strided, stride 128 (Child et al. 2019)
    fixed       variant sparse, fixed, stride 128, summary 16
    axial       variant axial, 1-D sequence folded into rows of 128 (Ho et al. 2019)
    local-kernel, linear-kernel, sparse-kernel, fixed-kernel, axial-kernel   those variants' kernels alone
                on ready (B, H, T, D) tensors, as bare sdpa: the issues' kernel targets compare these with sdpa
                (the modules add the same projections as the full module around it)
    routing     variant routing (Roy et al. 2021), clusters ceil(sqrt(n_max)), chunks of n_max / clusters, every
                head routing (local_heads=0)
    lsh         variant lsh (Kitaev et al. 2020), 4 hashing rounds, chunks of 64, n_max / 64 buckets
    local-global, sparse-global   local and sparse (strided) as above with global_tokens=16 (Longformer / BigBird)
    routing-kernel, lsh-kernel, local-global-kernel, sparse-global-kernel   their kernels alone, on ready tensors
                (n_max: the longest length of the run; give one length per run for n_max = n)
    lsh-kernel-reference   lsh-kernel with the fast paths off (ZOO_FAST_KERNELS=0's reference path) during its
                calls: beside lsh-kernel, what the fused rounds save, measured in one run
    local-flex  (--flex) variant local's kernel through compiled FlexAttention (backend flex), forward only:
                FlexAttention has no CPU backward; compiled once per length (~30 s each, not timed)

and bidirectional ones (compared with full-bidir):

    sdpa-bidir  F.scaled_dot_product_attention(q, k, v) on ready tensors
    full-bidir  zoo MultiHeadAttention, variant full, not causal
    compressed  variant compressed, k = 256 (Linformer, Wang et al. 2020)
    compressed-kernel   its kernel alone (with its learned length projections) on ready tensors, against
                sdpa-bidir

Time: median of interleaved repeats (every round runs each row once, in rotating order, then rows
under 30% of the slowest one get twice as many extra rounds among themselves), so that load from
other processes on the shared machine hits all rows alike; forward under no_grad, and
forward + backward (gradients of inputs and weights). `--timer wall` (default) measures wall-clock
time; on a heavily shared machine `--threads 1 --timer thread` measures the CPU time of the one
computing thread (time.thread_time: ops and autograd run inline in it), which time spent waiting for
a core does not inflate. Peak memory: the high-water mark of bytes
allocated during the call and not yet freed, from the PyTorch profiler's allocator events
(profile_memory=True: every CPU tensor allocation and free, including those inside kernels), minus
nothing that existed before the call; on CUDA, torch.cuda.max_memory_allocated over the call.

Writes experiments/results/attention_benchmark.{csv,md,png}.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.reproduce import KERNEL_TARGETS, cpu_name  # noqa: E402
from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout  # noqa: E402
from zoo.attention.blockwise import DENSE_MAX_LENGTH  # noqa: E402
from zoo.attention.fast import set_fast_kernels, use_fast_kernels  # noqa: E402

nan = float("nan")
HEADS, HEAD_DIM, WINDOW = 4, 64, 256
STRIDE, SUMMARY, ROW_LENGTH, COMPRESSED_LENGTH = 128, 16, 128, 256
GLOBAL_TOKENS, LSH_HASHES, LSH_CHUNK = 16, 4, 64
DIM = HEADS * HEAD_DIM
CAUSAL_ROWS = ["sdpa", "sdpa+proj", "full", "rope", "alibi", "t5", "local", "linear", "sparse", "fixed", "axial"]
CAUSAL_ROWS += ["routing", "lsh", "local-global", "sparse-global"]
KERNEL_ROWS = ["local-kernel", "linear-kernel", "sparse-kernel", "fixed-kernel", "axial-kernel"]
KERNEL_ROWS += ["routing-kernel", "lsh-kernel", "local-global-kernel", "sparse-global-kernel", "lsh-kernel-reference"]
BIDIRECTIONAL_ROWS = ["sdpa-bidir", "full-bidir", "compressed", "compressed-kernel"]
ROWS = CAUSAL_ROWS + KERNEL_ROWS + BIDIRECTIONAL_ROWS
FORWARD_ONLY = ("local-flex",)  # rows without a backward (on the CPU)
BARE = ("sdpa", "sdpa-bidir", *KERNEL_ROWS, "compressed-kernel", *FORWARD_ONLY)  # rows that take ready q, k, v


def references(row: str) -> tuple[str, str]:
    """(bare SDPA row, full-attention module row) a row is compared with: causal or bidirectional."""
    return ("sdpa-bidir", "full-bidir") if row in BIDIRECTIONAL_ROWS else ("sdpa", "full")


def causal(row: str) -> bool:
    return row not in BIDIRECTIONAL_ROWS


RESULTS = Path(__file__).resolve().parent / "results"


def build_rows(
    device: torch.device, max_length: int, dtype: torch.dtype = torch.float32
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each row maps an input (x (1, T, DIM), or q/k/v stacked for the bare rows) to an output."""
    torch.manual_seed(0)
    modules = {
        "full": MultiHeadAttention(DIM, HEADS, causal=True),
        "rope": MultiHeadAttention(DIM, HEADS, causal=True, rope=True),
        "alibi": MultiHeadAttention(DIM, HEADS, causal=True, position_bias="alibi"),
        "t5": MultiHeadAttention(DIM, HEADS, causal=True, position_bias="t5"),
        "local": MultiHeadAttention(DIM, HEADS, variant="local", window=WINDOW, causal=True),
        "linear": MultiHeadAttention(DIM, HEADS, variant="linear", causal=True),
        "sparse": MultiHeadAttention(DIM, HEADS, variant="sparse", stride=STRIDE, causal=True),
        "fixed": MultiHeadAttention(
            DIM, HEADS, variant="sparse", pattern="fixed", stride=STRIDE, summary=SUMMARY, causal=True
        ),
        "axial": MultiHeadAttention(DIM, HEADS, variant="axial", row_length=ROW_LENGTH, causal=True),
        "routing": MultiHeadAttention(  # every head routes: the routing kernel's cost, not its local heads'
            DIM, HEADS, variant="routing", local_heads=0, causal=True, layout=TokenLayout(max_length=max_length)
        ),
        "lsh": MultiHeadAttention(
            DIM,
            HEADS,
            variant="lsh",
            hashes=LSH_HASHES,
            chunk_size=LSH_CHUNK,
            causal=True,
            layout=TokenLayout(max_length=max_length),
        ),
        "local-global": MultiHeadAttention(
            DIM, HEADS, variant="local", window=WINDOW, global_tokens=GLOBAL_TOKENS, causal=True
        ),
        "sparse-global": MultiHeadAttention(
            DIM, HEADS, variant="sparse", stride=STRIDE, global_tokens=GLOBAL_TOKENS, causal=True
        ),
        "full-bidir": MultiHeadAttention(DIM, HEADS),
        "compressed": MultiHeadAttention(
            DIM,
            HEADS,
            variant="compressed",
            compressed_length=COMPRESSED_LENGTH,
            layout=TokenLayout(max_length=max_length),
        ),  # fmt: skip
    }
    modules = {name: module.to(device, dtype) for name, module in modules.items()}
    in_proj = torch.nn.Linear(DIM, 3 * DIM).to(device, dtype)
    out_proj = torch.nn.Linear(DIM, DIM).to(device, dtype)
    kernels = {
        f"{name}-kernel": modules[name].kernel
        for name in ("local", "linear", "sparse", "fixed", "axial", "routing", "lsh", "local-global", "sparse-global")
    }
    kernels["compressed-kernel"] = modules["compressed"].kernel
    flex_local = AttentionConfig(variant="local", window=WINDOW, backend="flex").build_kernel()

    def bare_kernel(kernel: torch.nn.Module, is_causal: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
        def attend(qkv: torch.Tensor) -> torch.Tensor:
            return kernel(*qkv.unbind(0), causal=is_causal)[0]

        return attend

    def sdpa(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def sdpa_bidirectional(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.unbind(0)
        return F.scaled_dot_product_attention(q, k, v)

    def sdpa_with_projections(x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, HEAD_DIM).transpose(1, 2) for t in in_proj(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out_proj(out.transpose(1, 2).reshape(batch, length, DIM))

    def with_fast_kernels_off(attend: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def reference(qkv: torch.Tensor) -> torch.Tensor:  # the backward follows the graph the forward built
            was_on = use_fast_kernels()
            set_fast_kernels(False)
            try:
                return attend(qkv)
            finally:
                set_fast_kernels(was_on)

        return reference

    bare = {name: bare_kernel(kernel, causal(name)) for name, kernel in kernels.items()}
    bare["lsh-kernel-reference"] = with_fast_kernels_off(bare["lsh-kernel"])
    bare["local-flex"] = bare_kernel(flex_local)
    return {"sdpa": sdpa, "sdpa+proj": sdpa_with_projections, "sdpa-bidir": sdpa_bidirectional, **modules, **bare}


def make_input(row: str, length: int, device: torch.device, requires_grad: bool, dtype: torch.dtype) -> torch.Tensor:
    shape = (3, 1, HEADS, length, HEAD_DIM) if row in BARE else (1, length, DIM)
    return torch.randn(shape, device=device, dtype=dtype, requires_grad=requires_grad)


def forward(fn: Callable, x: torch.Tensor) -> None:
    with torch.no_grad():
        fn(x)


def forward_backward(fn: Callable, x: torch.Tensor) -> None:
    fn(x).sum().backward()
    x.grad = None


def timed(step: Callable, fn: Callable, x: torch.Tensor, device: torch.device, clock: Callable[[], float]) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = clock()
    step(fn, x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return clock() - start


def peak_bytes(step: Callable, fn: Callable, x: torch.Tensor, device: torch.device) -> int:
    """High-water mark of the bytes allocated during one call (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(fn, x)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with memory_profile() as prof:
        step(fn, x)
    return profiled_peak(prof)


def memory_profile() -> torch.profiler.profile:
    """A CPU profiler that records every tensor allocation and free (read by profiled_peak once it has stopped)."""
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)


def profiled_peak(prof: torch.profiler.profile) -> int:
    """The high-water mark of tensor bytes allocated while `prof` ran, above what was live when it started."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def rounds_for(length: int, quick: bool) -> int:
    """Many cheap repeats for short sequences (noise dominates there), few for the long ones."""
    if length >= 32768:
        return 2
    if length >= 16384:
        return 3
    if length >= 8192:
        return 5 if quick else 7
    if length >= 4096:
        return 7 if quick else 9
    return 9 if quick else 15


def measure(
    device: torch.device,
    lengths: list[int],
    quick: bool,
    clock: Callable[[], float],
    log: Callable[[str], None],
    names: list[str] = ROWS,
    dtype: torch.dtype = torch.float32,
) -> list[dict]:
    rows = build_rows(device, max(lengths), dtype)
    if device.type != "cpu":
        clock = time.perf_counter  # kernels run asynchronously on other devices: wall clock after a sync
    results = []
    for length in lengths:
        record = {name: {"device": device.type, "length": length, "variant": name} for name in names}
        for mode, step, grad in (("forward", forward, False), ("train", forward_backward, True)):
            active = [name for name in names if not (grad and name in FORWARD_ONLY and device.type == "cpu")]
            inputs = {name: make_input(name, length, device, grad, dtype) for name in active}
            for name in active:  # warm-up (caches, allocator, compilation; long runs warm up in the memory run)
                if length < 4096 or name in FORWARD_ONLY:
                    step(rows[name], inputs[name])
                record[name][f"{mode}_peak_mib"] = peak_bytes(step, rows[name], inputs[name], device) / 2**20
            times: dict[str, list[float]] = {name: [] for name in active}
            rounds = rounds_for(length, quick)
            for round_index in range(rounds):
                order = active[round_index % len(active) :] + active[: round_index % len(active)]
                for name in order:
                    times[name].append(timed(step, rows[name], inputs[name], device, clock))
            # Rows much cheaper than the slowest get twice as many extra rounds (still interleaved
            # among themselves): a steadier median at a small cost.
            slowest = max(statistics.median(t) for t in times.values())
            cheap = [name for name in active if statistics.median(times[name]) < 0.3 * slowest]
            for _ in range(2 * rounds if len(cheap) > 1 else 0):
                for name in cheap:
                    times[name].append(timed(step, rows[name], inputs[name], device, clock))
            for name in names:
                record[name][f"{mode}_ms"] = 1e3 * statistics.median(times[name]) if name in times else float("nan")
                record[name].setdefault(f"{mode}_peak_mib", float("nan"))
        for name in names:
            row = record[name]
            bare, full = references(name)
            for mode in ("forward", "train"):
                own = row[f"{mode}_ms"]
                row[f"{mode}_vs_sdpa"] = own / record[bare][f"{mode}_ms"] if bare in record else nan
                row[f"{mode}_speedup_vs_full"] = record[full][f"{mode}_ms"] / own if full in record else nan
            results.append(row)
        log(
            f"{device.type} n={length}: "
            + ", ".join(f"{name} {record[name]['forward_ms']:.1f}/{record[name]['train_ms']:.1f} ms" for name in names)
        )
    return results


def machine_info() -> dict[str, str]:
    info = {
        "CPU": cpu_name(),
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    if torch.cuda.is_available():
        info["GPU"] = torch.cuda.get_device_name()
    if hasattr(os, "getloadavg"):
        info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return info


def per_doubling(results: list[dict], device: str, variant: str, key: str) -> list[tuple[int, float]]:
    """(n, value(n) / value(n / 2)) for consecutive lengths."""
    series = sorted((r["length"], r[key]) for r in results if r["device"] == device and r["variant"] == variant)
    return [(n, value / previous) for (m, previous), (n, value) in zip(series, series[1:]) if n == 2 * m]


def fitted_doubling(results: list[dict], device: str, variant: str, key: str, shortest: int) -> float:
    """2 ** the least-squares slope of log2(value) against log2(n), n >= shortest: the factor per doubling of n
    that one power law through every length gives (steadier than any one pair of lengths); nan below two lengths."""
    series = [r for r in results if (r["device"], r["variant"]) == (device, variant) and r["length"] >= shortest]
    points = [(math.log2(r["length"]), math.log2(r[key])) for r in series if r[key] > 0]
    if len(points) < 2:
        return nan
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return 2**slope


def lookup(results: list[dict], device: str, variant: str, length: int) -> dict | None:
    return next((r for r in results if (r["device"], r["variant"], r["length"]) == (device, variant, length)), None)


def targets(results: list[dict], device: str) -> list[str]:
    """The issue's performance targets, each with the measured value and met / not met."""
    lines = []
    lengths = sorted({r["length"] for r in results if r["device"] == device})
    n = 8192 if 8192 in lengths else lengths[-1]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    present = {r["variant"] for r in results if r["device"] == device}  # --rows may leave some out
    if not {"full", "sdpa", "sdpa+proj"} <= present:
        return ["- (the full, sdpa and sdpa+proj rows are needed for the targets)"]
    full_ratios = [(m, lookup(results, device, "full", m)["forward_vs_sdpa"]) for m in lengths]
    proj_ratios = [
        (m, lookup(results, device, "full", m)["forward_ms"] / lookup(results, device, "sdpa+proj", m)["forward_ms"])
        for m in lengths
    ]
    longest = full_ratios[-1][1]
    lines.append(
        f"- full module <= 1.05x bare SDPA (forward): {longest:.3f}x at n={lengths[-1]} ({verdict(longest <= 1.05)}); "
        "by n: "
        + ", ".join(f"{m}: {r:.2f}" for m, r in full_ratios)
        + ". The module includes the in/out projections that bare SDPA does not; against the same projections"
        " around bare SDPA (sdpa+proj) the module costs: " + ", ".join(f"{m}: {r:.2f}" for m, r in proj_ratios)
    )
    # Issue #51's targets: a position bias computed inside the kernel costs about what full attention costs.
    for bias in ("alibi", "t5"):
        for m in lengths:
            row, ref = lookup(results, device, bias, m), lookup(results, device, "full", m)
            if row is None or ref is None:
                continue
            time_ratio = row["train_ms"] / ref["train_ms"]
            memory_ratio = row["train_peak_mib"] / ref["train_peak_mib"]
            lines.append(
                f"- full+{bias} forward+backward <= 1.3x full at n={m}: {time_ratio:.2f}x "
                f"({verdict(time_ratio <= 1.3)}); peak memory <= 1.2x full's: {memory_ratio:.2f}x "
                f"({verdict(memory_ratio <= 1.2)})"
            )
    # Issue #17's targets for local and linear: the kernel alone against bare SDPA (the issue's "full causal
    # SDPA") and, for reference, the module against the full module (both add the same projections).
    for variant in ("local", "linear"):
        for mode, m, goal in KERNEL_TARGETS[variant]:
            kernel, module = lookup(results, device, f"{variant}-kernel", m), lookup(results, device, variant, m)
            if kernel is None or module is None:
                lines.append(f"- {variant} {mode} >= {goal}x faster than full causal at n={m}: not measured")
                continue
            speedup = 1 / kernel[f"{mode}_vs_sdpa"]
            label = "forward" if mode == "forward" else "forward+backward"
            lines.append(
                f"- {variant} {label} >= {goal}x faster than full causal SDPA at n={m}: kernel {speedup:.2f}x "
                f"({verdict(speedup >= goal)}); module vs full module {module[f'{mode}_speedup_vs_full']:.2f}x"
            )
    for row_name, reference in (("local", "full"), ("local-kernel", "sdpa")):
        row, ref = lookup(results, device, row_name, n), lookup(results, device, reference, n)
        if row is not None and ref is not None:
            lines.append(
                f"- {row_name} forward+backward peak memory at n={n} <= {reference}'s: {row['train_peak_mib']:.1f} "
                f"vs {ref['train_peak_mib']:.1f} MiB ({verdict(row['train_peak_mib'] <= ref['train_peak_mib'])})"
            )
    # Issue #15's targets, read as #17's: the kernel against bare SDPA ("faster than full causal SDPA"), the verdict;
    # the module against the full module beside it (the same projections around both cap that ratio).
    for variant in ("sparse", "fixed", "axial", "compressed"):
        target = KERNEL_TARGETS[variant][0][2] if variant in KERNEL_TARGETS else None
        kernel, module = lookup(results, device, f"{variant}-kernel", n), lookup(results, device, variant, n)
        if kernel is None or module is None:
            continue
        kind = "causal" if causal(variant) else "bidirectional"
        goal = f">= {target}x" if target else "(no target)"
        parts = []
        for mode, label in (("forward", "forward"), ("train", "forward+backward")):
            speedup = 1 / kernel[f"{mode}_vs_sdpa"]
            mark = f" ({verdict(speedup >= target)})" if target else ""
            versus_full = module[f"{mode}_speedup_vs_full"]
            parts.append(f"{label} kernel {speedup:.2f}x{mark}, module vs full module {versus_full:.2f}x")
        lines.append(f"- {variant} {goal} faster than full {kind} SDPA at n={n}: " + "; ".join(parts))
    # Memory per doubling of n, forward+backward, where both lengths take the blockwise path (the pattern
    # kernels run short sequences densely: zoo.attention.blockwise.DENSE_MAX_LENGTH).
    for variant, bound, law, shortest in (
        ("local", 2.2, "linearly", 1024),
        ("sparse", 2.9, "at most ~n^1.5", 4 * DENSE_MAX_LENGTH),
        ("axial", 2.9, "at most ~n^1.5", 4 * DENSE_MAX_LENGTH),
        ("compressed", 2.2, "linearly", 1024),
    ):
        growth = [(m, r) for m, r in per_doubling(results, device, variant, "train_peak_mib") if m >= shortest]
        if not growth:  # a target that does not apply to these lengths is not a missed one
            lines.append(f"- {variant} memory growth in n: not measured (needs two lengths from {shortest} up)")
            continue
        worst = max(r for _, r in growth)
        lines.append(
            f"- {variant} memory grows {law} in n (peak MiB ratio per doubling, forward+backward, n >= {shortest}; "
            f"<= {bound}): worst {worst:.2f} ({verdict(worst <= bound)}); "
            + ", ".join(f"{m}: {r:.2f}" for m, r in growth)
        )
    for variant in ("linear-kernel", "linear"):
        for mode, label in (("forward", "forward"), ("train", "forward+backward")):
            doubling = [(m, r) for m, r in per_doubling(results, device, variant, f"{mode}_ms") if m > 4096]
            fit = fitted_doubling(results, device, variant, f"{mode}_ms", 4096)
            if math.isnan(fit):
                lines.append(
                    f"- {variant} time per doubling of n ({label}): not measured (needs two lengths from 4096 up)"
                )
                continue
            worst = max(r for _, r in doubling) if doubling else nan
            lines.append(
                f"- {variant} <= 2.1x time per doubling of n ({label}, from 4096 up, one power law fitted to every "
                f"length): {fit:.2f}x ({verdict(fit <= 2.1)}); each doubling: "
                + ", ".join(f"{m}: {r:.2f}" for m, r in doubling)
                + f" (worst pair {worst:.2f}x)"
            )
    return lines


def write_markdown(results: list[dict], info: dict[str, str], path: Path, quick: bool, note: str = "") -> None:
    lines = ["# Attention benchmark", ""]
    lines.append(
        f"Self-attention, B=1, H={HEADS}, head dim {HEAD_DIM}, {info.get('dtype', 'float32')}; causal rows"
        f": local window {WINDOW}, sparse "
        f"strided stride {STRIDE}, fixed stride {STRIDE} summary {SUMMARY}, axial rows of {ROW_LENGTH}; "
        f"bidirectional rows (sdpa-bidir, full-bidir, compressed with k={COMPRESSED_LENGTH}) compare with "
        "full-bidir. "
        f"Median of interleaved repeats{' (--quick)' if quick else ''}. "
        "Written by `experiments/attention_benchmark.py`."
    )
    if note:
        lines += ["", note]
    lines += ["", "| | |", "|---|---|"] + [f"| {key} | {value} |" for key, value in info.items()]
    lines += [
        "",
        "Peak memory: high-water mark of bytes allocated during the call (CPU: profiler allocator events; "
        "CUDA: max_memory_allocated), excluding inputs and weights.",
        "Ratios: `x sdpa` = time / bare SDPA time (lower is better); `speed-up` = full module time / time "
        "(causal rows against the causal ones, bidirectional against the bidirectional ones).",
    ]
    for device in sorted({r["device"] for r in results}):
        lines += ["", f"## {device}", "", "### Targets", ""] + targets(results, device)
        lines += [
            "",
            "### All rows",
            "",
            "| n | variant | fwd ms | fwd+bwd ms | fwd peak MiB | fwd+bwd peak MiB | fwd x sdpa | "
            "fwd+bwd x sdpa | fwd speed-up vs full | fwd+bwd speed-up vs full |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in results:
            if r["device"] != device:
                continue
            lines.append(
                f"| {r['length']} | {r['variant']} | {r['forward_ms']:.1f} | {r['train_ms']:.1f} | "
                f"{r['forward_peak_mib']:.1f} | {r['train_peak_mib']:.1f} | {r['forward_vs_sdpa']:.2f} | "
                f"{r['train_vs_sdpa']:.2f} | {r['forward_speedup_vs_full']:.2f} | {r['train_speedup_vs_full']:.2f} |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = sorted({r["device"] for r in results})
    fig, axes = plt.subplots(len(devices), 2, figsize=(12, 4.8 * len(devices)), squeeze=False)
    for row_axes, device in zip(axes, devices):
        for name in [name for name in (*ROWS, *FORWARD_ONLY) if any(r["variant"] == name for r in results)]:
            series = sorted((r["length"], r) for r in results if r["device"] == device and r["variant"] == name)
            lengths = [n for n, _ in series]
            (line,) = row_axes[0].plot(lengths, [r["forward_ms"] for _, r in series], "o-", label=f"{name} forward")
            row_axes[0].plot(
                lengths, [r["train_ms"] for _, r in series], "s--", color=line.get_color(), label=f"{name} fwd+bwd"
            )
            row_axes[1].plot(
                lengths, [r["train_peak_mib"] for _, r in series], "s--", color=line.get_color(), label=name
            )
        row_axes[0].set_title(f"Time, B=1, H={HEADS}, d={HEAD_DIM} ({device})")
        row_axes[0].set_ylabel("time per call (ms)")
        row_axes[1].set_title(f"Peak memory of forward+backward ({device})")
        row_axes[1].set_ylabel("peak allocated memory (MiB)")
        for ax in row_axes:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n (tokens)")
            ax.grid(True, which="both", alpha=0.3)
        row_axes[0].legend(fontsize=7, ncol=2)
        row_axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="lengths up to 8192 and fewer repeats")
    parser.add_argument("--lengths", type=int, nargs="*", help="override the sequence lengths")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    parser.add_argument("--note", default="", help="a remark for the markdown report (e.g. machine load)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, the core count)")
    parser.add_argument(
        "--timer", choices=["wall", "thread"], default="wall", help="wall clock, or CPU time of the calling thread"
    )
    parser.add_argument("--rows", nargs="*", help=f"only these rows (while iterating); default: all of {ROWS}")
    parser.add_argument("--flex", action="store_true", help="add the local-flex row (compiled FlexAttention)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--cpu-only", action="store_true", help="skip CUDA even when present")
    args = parser.parse_args()
    names = list(args.rows or ROWS) + (["local-flex"] if args.flex else [])
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.timer == "thread" and torch.get_num_threads() != 1:
        parser.error("--timer thread measures one thread: use it with --threads 1")
    clock = time.thread_time if args.timer == "thread" else time.perf_counter
    lengths = args.lengths or [256 * 2**i for i in range(6 if args.quick else 8)]
    cuda = torch.cuda.is_available() and not args.cpu_only
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if cuda else [])
    info = machine_info()
    info["dtype"] = args.dtype
    info["timer"] = "CPU time of the computing thread (time.thread_time)" if args.timer == "thread" else "wall clock"
    print(" | ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    results = []
    for device in devices:
        results += measure(device, lengths, args.quick, clock, lambda line: print(line, flush=True), names, dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "attention_benchmark.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    write_markdown(results, info, args.out / "attention_benchmark.md", args.quick, args.note)
    plot(results, args.out / "attention_benchmark.png")
    for device in sorted({r["device"] for r in results}):
        print("\n".join(targets(results, device)))


if __name__ == "__main__":
    main()
