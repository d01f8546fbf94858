"""Regenerate every headline number, table and plot of zoo: one command.

    python experiments/reproduce.py --quick     # minutes on 2 CPU cores: every study, scaled down
    python experiments/reproduce.py             # the real thing (hours on 2 CPU cores)
    python experiments/reproduce.py --reuse     # keep finished runs, redo only what is missing (after a stop)
    python experiments/reproduce.py --only speed gpt

Studies (each is one script or one Hydra experiment, runnable on its own; this file only runs them and
gathers their numbers):
- attention: experiments/attention_benchmark.py, time and memory vs sequence length per variant;
- speed: experiments/gpt_throughput.py (tokens/s of the GPT through Lightning vs a plain PyTorch loop vs
  Hugging Face GPT-2, with MFU), experiments/vit_throughput.py (images/s vs timm), and
  experiments/kv_cache_benchmark.py (per-token generation time vs context), experiments/kv_cache_memory.py
  (KV-cache bytes per token with grouped-query heads);
- gpt, vit, translation, clip: quality per model x attention variant through `python run.py ...`, next to
  the published anchors;
- variants: experiments/variant_study.py, every attention setting in every family and on the long-range tasks
  (pixel sequences, ListOps), quality next to speed.

Full mode writes experiments/results/RESULTS.md (and its PNG plots and the per-study files); --quick
writes experiments/results/quick/ so that a quick check never replaces the committed figures (--out picks another
folder). The page's headline is the one of README.md and the docs, rendered from experiments/results/headline.json
(experiments/headline.py); the figures this run measured follow it, and one replaces a headline figure by an edit of
headline.json. Training runs land in outputs/reproduce/<mode>/<run>/ (metrics.json, checkpoints, logs; --runs picks
another folder). Data: tiny-shakespeare and Multi30k are read from --shared (default ../shared/data, else they are
downloaded when online), Fashion-MNIST from --fashion-mnist (default Debian's /usr/share/datasets/fashion-mnist,
else downloaded).
A study whose data cannot be found is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script without the package installed: zoo is beside experiments/
    sys.path.insert(0, str(ROOT))
from experiments.headline import block as headline_block  # noqa: E402

EXPERIMENTS = ROOT / "experiments"
VARIANTS = ("full", "local", "linear", "rope")
BOUNDED_STATE = ("local", "linear")  # decoding state of a fixed size: per-token time independent of the context
BOUNDED_STATE_TARGET = 1.1  # their per-token time at the longest context vs the shortest (#17: "independent")
KV_MEMORY = "kv_cache_memory.md"  # experiments/kv_cache_memory.py's table, in the results folder
STUDIES = ("attention", "speed", "gpt", "vit", "translation", "clip", "variants")
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)  # Fashion-MNIST


@dataclass
class Run:
    """One `python run.py` job of a quality study."""

    study: str
    name: str  # run directory name, unique within a mode
    label: str  # row label in the tables
    variant: str  # attention variant, or "-" where the experiment has one fixed attention
    overrides: list[str]
    metric: str  # the metrics.json key reported
    anchor: str = ""
    needs: list[Path] = field(default_factory=list)  # files that must exist, as glob patterns (else skipped)


def quality_runs(args: argparse.Namespace) -> list[Run]:
    quick, seeds = args.quick, range(args.seeds)
    shakespeare = args.shared / "tinyshakespeare" / "input.txt"
    multi30k = args.shared / "multi30k"
    multi30k_files = [multi30k / f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
                      for lang in ("de", "en")]  # fmt: skip
    fashion_files = [args.fashion_mnist / f"{name}*" for name in IDX_FILES]  # plain or .gz
    runs: list[Run] = []
    for variant in VARIANTS:
        for seed in seeds:
            runs.append(Run(
                "gpt", f"gpt_shakespeare_char-{variant}-seed{seed}", "GPT, tiny-shakespeare char (val loss)", variant,
                ["experiment=gpt_shakespeare_char", f"attention={variant}", f"data.path={shakespeare}", f"seed={seed}",
                 *(["trainer.max_steps=300", "trainer.val_check_interval=300"] if quick else [])],
                "val/loss", "nanoGPT 1.88 (CPU run) / 1.4697 (GPU run)", [shakespeare],
            ))  # fmt: skip
    for variant in VARIANTS:
        for seed in seeds:
            runs.append(Run(
                "vit", f"vit_digits-{variant}-seed{seed}", "ViT, digits (test accuracy)", variant,
                ["model=vit", f"attention={variant}", f"seed={seed}", *(["trainer.max_epochs=10"] if quick else [])],
                "test/acc", "SVC 0.969 (scikit-learn's example)",
            ))  # fmt: skip
    runs.append(Run(
        "vit", "vit_fashion_mnist", "ViT, Fashion-MNIST (test accuracy)", "full",
        ["experiment=vit_fashion_mnist", f"data.data_dir={args.fashion_mnist}",
         *(["trainer.max_epochs=1", "+trainer.limit_train_batches=50", "+trainer.limit_test_batches=20"] if quick
           else [])],
        "test/acc", "small ViT 0.923", fashion_files,
    ))  # fmt: skip
    runs.append(Run(
        "translation", "translation_multi30k", "Transformer, Multi30k de-en test_2016_flickr (BLEU, beam 5)", "full",
        ["experiment=translation_multi30k", f"data.data_dir={multi30k}",
         *(["trainer.max_epochs=1", "+trainer.limit_train_batches=20", "+trainer.limit_val_batches=2",
            "+trainer.limit_test_batches=2"] if quick else [])],
        "test/bleu", "36.5 greedy at ~9M parameters", multi30k_files,
    ))  # fmt: skip
    runs.append(Run(
        "clip", "clip_fashion_mnist", "CLIP, Fashion-MNIST zero-shot (top-1)", "full",
        ["experiment=clip_fashion_mnist", f"data.images.data_dir={args.fashion_mnist}",
         *(["trainer.max_epochs=1", "+trainer.limit_train_batches=30", "+trainer.limit_val_batches=2"] if quick
           else [])],
        "test/zero_shot_top1", "", fashion_files,
    ))  # fmt: skip
    return [run for run in runs if run.study in args.only]


# -- running ---------------------------------------------------------------------------------------------
def run_command(command: list[str], log: Path) -> tuple[int, float]:
    """Run a command with its output teed to `log`; returns (exit code, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("$ " + " ".join(command), flush=True)
    start = time.perf_counter()
    with open(log, "w") as handle:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            handle.write(line)
            if not line.startswith(("round ", "[")) or "error" in line.lower():
                sys.stdout.write("  " + line)
        code = process.wait()
    return code, time.perf_counter() - start


def run_quality(run: Run, runs_dir: Path, reuse: bool) -> dict:
    out = runs_dir / run.name
    metrics_file = out / "metrics.json"
    missing = [str(path) for path in run.needs if not any(path.parent.glob(path.name))]
    if missing:
        return {"status": f"skipped: {', '.join(missing)} not found"}
    if reuse and metrics_file.is_file():
        print(f"reusing {out}", flush=True)
    else:
        if out.exists():  # an unfinished or older run: keep it aside rather than delete it
            out.rename(out.with_name(f"{out.name}.old-{datetime.now():%Y%m%d-%H%M%S}"))
        command = [sys.executable, "run.py", *run.overrides, f"hydra.run.dir={out}", "print_config=false",
                   "callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=false"]  # fmt: skip
        code, wall = run_command(command, runs_dir / f"{run.name}.log")
        if code != 0 or not metrics_file.is_file():
            return {"status": f"failed (exit {code}): see {runs_dir / f'{run.name}.log'}"}
        (out / "wall_seconds.txt").write_text(f"{wall:.1f}\n")
    metrics = json.loads(metrics_file.read_text())
    wall_file = out / "wall_seconds.txt"
    return {
        "status": "ok", "value": metrics.get(run.metric), "metrics": metrics,
        "wall_s": float(wall_file.read_text()) if wall_file.is_file() else None,
        "date": datetime.fromtimestamp(metrics_file.stat().st_mtime).strftime("%Y-%m-%d"),
    }  # fmt: skip


def run_script(script: str, arguments: list[str], json_path: Path, logs: Path) -> dict | None:
    code, _ = run_command([sys.executable, str(EXPERIMENTS / script), *arguments, "--json", str(json_path)],
                          logs / f"{Path(script).stem}.log")  # fmt: skip
    if code != 0 or not json_path.is_file():
        print(f"{script} failed (exit {code}); see {logs / (Path(script).stem + '.log')}", flush=True)
        return None
    return json.loads(json_path.read_text())


# -- machine ---------------------------------------------------------------------------------------------
def cpu_name() -> str:
    """The CPU's model name with what decides its speed here: the vector unit torch runs on and whether it computes
    bf16 natively (e.g. 'AMD EPYC (AVX2, no native bf16 found)': one name covers CPU generations ~2x apart)."""
    import torch

    from zoo.hardware import native_bf16

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    bf16 = "bf16 native" if native_bf16("cpu") else "no native bf16 found"  # the probes are x86 ones
    return f"{cpu} ({torch.backends.cpu.get_cpu_capability()}, {bf16})"


def machine() -> dict[str, str]:
    import torch

    info = {"CPU": cpu_name(), "cores": str(os.cpu_count()), "torch": torch.__version__,
            "GPU": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "python": platform.python_version(), "date": datetime.now().strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    if hasattr(os, "getloadavg"):
        info["load average at start"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return info


# -- tables and plots ------------------------------------------------------------------------------------
def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarise_quality(runs: list[Run], results: dict[str, dict]) -> list[dict]:
    """One row per (label, variant): the median over seeds of the reported metric."""
    rows: dict[tuple[str, str], dict] = {}
    for run in runs:
        result = results[run.name]
        row = rows.setdefault((run.label, run.variant), {"run": run, "values": [], "walls": [], "notes": set(),
                                                         "dates": set()})  # fmt: skip
        if result["status"] == "ok" and result["value"] is not None:
            row["values"].append(result["value"])
            row["dates"].add(result["date"])
            if result["wall_s"] is not None:
                row["walls"].append(result["wall_s"])
        else:
            row["notes"].add(result["status"] if result["status"] != "ok" else f"no {run.metric} in metrics.json")
    summary = []
    for (label, variant), row in rows.items():
        values = row["values"]
        summary.append({
            "label": label, "variant": variant, "metric": row["run"].metric, "anchor": row["run"].anchor,
            "median": statistics.median(values) if values else None, "n": len(values),
            "range": (min(values), max(values)) if values else None,
            "wall_min": statistics.median(row["walls"]) / 60 if row["walls"] else None,
            "date": ", ".join(sorted(row["dates"])), "note": "; ".join(sorted(row["notes"])),
        })  # fmt: skip
    return summary


def quality_markdown(summary: list[dict]) -> str:
    rows = []
    for row in summary:
        digits = 1 if "bleu" in row["metric"] else (4 if "loss" in row["metric"] else 3)
        spread = "" if row["n"] < 2 else f" ({fmt(row['range'][0], digits)}-{fmt(row['range'][1], digits)})"
        rows.append([row["label"], row["variant"], fmt(row["median"], digits) + spread, row["n"],
                     fmt(row["wall_min"], 1), row["anchor"] or "-", row["date"] or "-", row["note"] or ""])  # fmt: skip
    header = ["model and task (metric)", "attention", "median (min-max)", "runs", "wall min / run", "published anchor",
              "run date", "note"]  # fmt: skip
    return table(header, rows)


def plot_quality(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("GPT, tiny-shakespeare", "val/loss", "validation loss (nats/char), lower is better", 1.88,
               "nanoGPT CPU run"),
              ("ViT, digits", "test/acc", "test accuracy, higher is better", 0.969, "SVC (scikit-learn)")]  # fmt: skip
    fig, axes = plt.subplots(1, len(groups), figsize=(10, 3.8))
    for ax, (prefix, metric, ylabel, anchor, anchor_name) in zip(axes, groups):
        rows = [r for r in summary if r["label"].startswith(prefix) and r["metric"] == metric and r["median"]]
        names = [r["variant"] for r in rows]
        medians = [r["median"] for r in rows]
        errors = [[r["median"] - r["range"][0] for r in rows], [r["range"][1] - r["median"] for r in rows]]
        ax.bar(names, medians, yerr=errors, capsize=4, color="tab:blue")
        ax.axhline(anchor, color="tab:red", linestyle="--", label=f"{anchor_name}: {anchor}")
        if medians:
            low, high = min(medians + [anchor]), max(medians + [anchor])
            ax.set_ylim(low - 0.15 * (high - low + 1e-3) - 0.01, high + 0.15 * (high - low + 1e-3) + 0.01)
        ax.set_title(f"{prefix} (median of seeds, whiskers min-max)", fontsize=10)
        ax.set_xlabel("attention variant")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# gpt_throughput.py's ratios and their targets (#19: the GPT recipe trains in bf16-mixed where the CPU has it natively).
GPT_TARGETS = {
    "Lightning / plain loop, fp32": ">= 0.97",
    "Lightning bf16-mixed / Lightning fp32": "-",
    "zoo Lightning (fastest) / zoo Lightning fp32 eager": ">= 1.2",
    "zoo Lightning (fastest) / HF GPT-2 (fastest)": ">= 1.3",
}


def speed_markdown(gpt: dict | None, vit: dict | None, kv: dict | None, figures: Path) -> tuple[str, list[str]]:
    """The speed section and the headline lines it contributes."""
    parts, headline = [], []
    if gpt:
        medians = {name: statistics.median(values) for name, values in gpt["tokens_per_s"].items()}
        peak, per_token = gpt["peak_flops"], gpt["flops_per_token"]
        a = gpt["args"]
        rows = [[name, f"{value:,.0f}", f"{value * per_token / peak:.1%}", ", ".join(f"{v:,.0f}" for v in
                 gpt["tokens_per_s"][name])] for name, value in medians.items()]  # fmt: skip
        found = gpt.get("ratios", {})
        ratios = [f"{label} **{found[label]:.3f}x**" + (f" (target {target})" if target != "-" else "")
                  for label, target in GPT_TARGETS.items() if label in found]  # fmt: skip
        precisions = ", ".join(a.get("precisions", ["32-true"]))
        parts.append(
            f"### GPT training throughput (`experiments/gpt_throughput.py`)\n\n{a['n_layer']} layers, {a['n_head']} "
            f"heads, width {a['n_embd']}, block {a['block_size']}, batch {a['batch_size']}, {precisions}, "
            f"{gpt['threads']} threads; median of {a['rounds']} interleaved rounds of {a['steps']} steps; MFU against "
            f"a measured fp32 matmul peak of {peak / 1e9:.0f} GFLOP/s"
            + (f" (measured {gpt['date'][:16].replace('T', ' ')} UTC)" if gpt.get("date") else "")
            + (
                ". 'compiled': the network under torch.compile (inductor), compiled in the untimed warm-up steps"
                if any("compiled" in name for name in medians)
                else ""
            )  # fmt: skip
            + ".\n\n"
            + table(["path", "tokens/s", "MFU", "rounds"], rows)
            + "\n\n"
            + "; ".join(ratios)
            + "."
        )
        for label, target in GPT_TARGETS.items():
            if label in found:
                shown = target if target == "-" else f"{target}x"
                headline.append(f"| GPT training tokens/s, {label} | {found[label]:.3f}x | {shown} |")
        plot_bars(medians, "tokens/s (training)", "GPT training throughput", figures / "gpt_throughput.png")
        parts.append("![GPT throughput](gpt_throughput.png)")
    if vit:
        a = vit["args"]
        rows = [[name, f"{value:,.1f}"] for name, value in vit["median"].items()]
        ratios = "; ".join(f"zoo / timm, {kind}: **{value:.3f}x**" for kind, value in vit["ratios"].items())
        parts.append(
            f"### ViT images/s vs timm (`experiments/vit_throughput.py`)\n\nImage {a['image_size']}, patch "
            f"{a['patch_size']}, width {a['dim']}, depth {a['depth']}, {a['heads']} heads "
            f"({vit['parameters'] / 1e6:.1f}M parameters), batch {a['batch_size']}, "
            f"{' and '.join(a.get('precisions', ['32-true']))}, {vit['threads']} threads, "
            f"the same weights in both; median of {a['rounds']} interleaved rounds. 'fastest': each model at its "
            f"faster precision (on the CPU zoo's bf16 training runs attention in fp32, whose fused backward is "
            f"4-14x faster than bf16's; timm's runs the bf16 one).\n\n"
            + table(["path", "images/s"], rows)
            + (f"\n\n{ratios}." if ratios else "\n\ntimm is not installed: `pip install -e '.[bench]'`.")
        )
        for kind, value in vit["ratios"].items():
            path, _, precision = kind.partition(", ")  # "train, fastest": each side at its faster precision
            label = f"ViT {'training' if path == 'train' else path} images/s ({precision or 'fp32'}), zoo / timm"
            headline.append(f"| {label} | {value:.3f}x | {'>= 1.2x' if kind == 'train, fastest' else '-'} |")
    if kv:
        a = kv["args"]
        contexts, per_token = a["contexts"], kv["seconds_per_token"]
        short = min(contexts)
        longer = [c for c in contexts if c != short]

        def ratio(row: dict, context: int) -> float:
            return row[f"cached@{context}"] / row[f"cached@{short}"]

        rows = [[name, *(f"{1000 * row[f'cached@{c}']:.2f}" for c in contexts),
                 *(f"{ratio(row, c):.2f}x" for c in longer)] for name, row in per_token.items()]  # fmt: skip
        parts.append(
            f"### Generation with the KV cache (`experiments/kv_cache_benchmark.py`)\n\nGPT {a['n_layer']} layers, "
            f"width {a['n_embd']}, vocabulary {a['vocab_size']}, batch 1, fp32: milliseconds per generated token at "
            f"each context length (median of {a['repeats']}). Targets: every variant <= 1.5x from {short} to "
            f"{min(longer)}; the variants whose decoding state does not grow (local's rolling window, linear's "
            f"recurrent state) <= {BOUNDED_STATE_TARGET}x at every context.\n\n"
            + table(["variant", *(f"ms/token @ {c}" for c in contexts), *(f"{c} / {short}" for c in longer)], rows)
        )
        worst = max(ratio(row, min(longer)) for row in per_token.values())
        headline.append(f"| per-token generation time, context {min(longer)} vs {short} (worst variant) | "
                        f"{worst:.2f}x | <= 1.5x |")  # fmt: skip
        bounded = [row for name, row in per_token.items() if name in BOUNDED_STATE]
        if bounded and len(longer) > 1:
            worst = max(ratio(row, c) for row in bounded for c in longer)
            headline.append(f"| per-token generation time, context {' and '.join(map(str, longer))} vs {short} "
                            f"(worst of local, linear) | {worst:.2f}x | <= {BOUNDED_STATE_TARGET}x |")  # fmt: skip
    return "\n\n".join(parts), headline


def plot_bars(values: dict[str, float], ylabel: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(values), list(values.values()), color=["tab:blue", "tab:orange", "tab:gray"][: len(values)])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kv_memory_markdown(out: Path) -> str:
    """experiments/kv_cache_memory.py's table as a section of the speed part ("" before it ran)."""
    path = out / KV_MEMORY
    if not path.is_file():
        return ""
    _, _, body = path.read_text().partition("\n")  # below its own title
    return f"### KV-cache memory per token, grouped-query heads (`experiments/kv_cache_memory.py`)\n\n{body.strip()}"


TWO_THREADS = "attention_benchmark_2threads"  # the benchmark's 2-thread run, a folder of the results


# Issues #17's and #15's kernel targets: the kernel alone against bare SDPA (causal; compressed against
# bidirectional SDPA): variant -> ((mode, n, at least this speed-up), ...).
KERNEL_TARGETS = {
    "local": (("forward", 8192, 10), ("forward", 32768, 30), ("train", 8192, 8), ("train", 32768, 25)),
    "linear": (("forward", 8192, 12), ("forward", 32768, 40), ("train", 8192, 8)),
    "sparse": (("forward", 8192, 5),),
    "axial": (("forward", 8192, 5),),
    "compressed": (("forward", 8192, 10),),
}


def kernel_headline(cpu: list[dict], threads: int) -> list[str]:
    """Headline rows of the kernel targets from one benchmark run's CSV rows (threads: that run's torch threads)."""
    label = {"forward": "forward", "train": "forward+backward"}
    run = f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""
    lines = []
    for name, goals in KERNEL_TARGETS.items():
        kind = "bidirectional" if name == "compressed" else "causal"
        for mode, length, target in goals:
            row = next((r for r in cpu if r["variant"] == f"{name}-kernel" and int(r["length"]) == length), None)
            if row is not None:
                speedup = 1 / float(row[f"{mode}_vs_sdpa"])
                lines.append(f"| {name} attention kernel speed-up vs {kind} SDPA at n={length} ({label[mode]}{run}) | "
                             f"{speedup:.2f}x | >= {target}x |")  # fmt: skip
    return lines


def attention_markdown(out: Path) -> tuple[str, list[str]]:
    csv_path = out / "attention_benchmark.csv"
    if not csv_path.is_file():
        return "", []
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    cpu = [r for r in rows if r["device"] == "cpu"]
    lengths = {int(r["length"]) for r in cpu}
    longest = max(lengths)
    shown = 8192 if 8192 in lengths else longest  # the length of issue #17's first targets
    at = {r["variant"]: r for r in cpu if int(r["length"]) == shown}
    body = [
        [name, f"{float(r['forward_ms']):.1f}", f"{float(r['train_ms']):.1f}", f"{float(r['forward_vs_sdpa']):.2f}x",
         f"{float(r['forward_speedup_vs_full']):.2f}x", f"{float(r['train_peak_mib']):.0f}"]
        for name, r in at.items()
    ]  # fmt: skip
    measured = ""
    report = out / "attention_benchmark.md"
    if report.is_file():  # the benchmark's own record of when and with how many threads it ran
        pattern = r"^\| (date|torch threads|load average at start) \| (.+?) \|$"
        fields = dict(re.findall(pattern, report.read_text(), re.M))
        measured = ", ".join(f"{key} {value}" for key, value in fields.items()) + "; "
    text = (
        f"### Attention scaling (`experiments/attention_benchmark.py`)\n\nSelf-attention (causal; the -bidir rows "
        f"and compressed bidirectional, against full-bidir; the -kernel rows are the kernels alone on ready q, k, v, "
        f"as bare SDPA), 4 heads of 64, fp32, CPU, at n = {shown} ({measured}every length, the targets and how it "
        f"is measured: [attention_benchmark.md](attention_benchmark.md)"
        + (
            f"; the same at 2 threads: [{TWO_THREADS}/attention_benchmark.md]({TWO_THREADS}/attention_benchmark.md)"
            if (out / TWO_THREADS / "attention_benchmark.md").is_file()
            else ""
        )
        + "). GPU figures: not measured here (no GPU "
        "on this machine); `python experiments/gpu_check.py` measures them on CUDA.\n\n"
        + table(
            [
                "variant",
                "forward ms",
                "forward+backward ms",
                "x bare SDPA",
                "speed-up vs full",
                "forward+backward peak MiB",
            ],
            body,
        )  # fmt: skip
        + "\n\n![attention scaling](attention_benchmark.png)"
    )
    headline = kernel_headline(cpu, int(fields.get("torch threads", 0)) if report.is_file() else 0)
    two = out / TWO_THREADS / "attention_benchmark.csv"
    if two.is_file():
        with open(two, newline="") as handle:
            headline += kernel_headline([r for r in csv.DictReader(handle) if r["device"] == "cpu"], 2)
    headline += [
        f"| {name} attention speed-up vs full{' bidirectional' if name == 'compressed' else ''} at n={shown} "
        f"(forward) | {float(at[name]['forward_speedup_vs_full']):.2f}x | >= {target}x |"
        for name, target in (("local", 5), ("linear", 5), ("sparse", 5), ("axial", 5), ("compressed", 10))
        if name in at
    ]
    return text, headline


POSITIONS = "variant_study_positions"  # the variant study's GPT rows of the position options, a folder of results
POSITION_ROWS = ("full", "rope", "rope+dynamic", "rope+linear", "rope+ntk", "full+alibi", "full+t5")


def positions_markdown(out: Path) -> str:
    """The GPT's val loss at its block and at 4x it per position option: the variant study's GPT columns, from
    its full page when that has them, else from the page of its run restricted to these rows (POSITIONS)."""
    for page in (out / "variant_study.md", out / POSITIONS / "variant_study.md"):
        text = page.read_text() if page.is_file() else ""
        found = re.search(r"^\| attention \|.*?(?=\n\n)", text, re.M | re.S)
        if found is None or "at 4x the block" not in found.group(0):
            continue
        lines = found.group(0).splitlines()
        header = lines[0].split(" | ")
        keep = [0] + [i for i, name in enumerate(header) if name.startswith("GPT")]
        rows = [line.split(" | ") for line in lines[2:]]
        rows = [row for row in rows if row[0].strip("| ") in POSITION_ROWS]
        picked = [" | ".join(cells[i].strip("| ") for i in keep) for cells in (header, *rows)]
        body = [f"| {picked[0]} |", "|" + "---|" * len(keep)] + [f"| {line} |" for line in picked[1:]]
        command = re.search(r"^Written by `([^`]+)`", text, re.M)
        when = re.search(r"^\| date \| (.+?) \|$", text, re.M)
        # Only the footnotes these rows cite, read from the table's own section (up to the next heading): each
        # table of the page numbers its footnotes from [1].
        cited = set(re.findall(r"\[\d+\]", "\n".join(picked)))
        section = re.split(r"^#", text[found.end() :], maxsplit=1, flags=re.M)[0]
        notes = "\n".join(note for note in re.findall(r"^\[\d+\] .*$", section, re.M) if note.split()[0] in cited)
        shown = page.relative_to(out)
        return (
            "### Position options in the GPT, at its block and at 4x it (`experiments/variant_study.py`)\n\n"
            "Tiny-shakespeare char GPT (`experiment=gpt_shakespeare_char`: 4 layers, 4 heads, width 128, block 64, "
            "2000 steps), val loss on the whole val split at the training block and at 4x it (a position bias takes "
            "the longer input as trained; linear, NTK-aware and dynamic RoPE scaling stretch the `rope` row's weights "
            "by 4 at inference, as their users apply them; the learned positions of `full` have no weights past the "
            "block), "
            f"{when.group(1) if when else ''}: `{command.group(1) if command else page}` ([its page]({shown})).\n\n"
            + "\n".join(body)
            + (f"\n\n{notes}" if notes else "")
        )
    return ""


def variant_study_markdown(out: Path) -> str:
    """The variant study's winners, with a link to its page (experiments/variant_study.py writes both)."""
    page = out / "variant_study.md"
    if not page.is_file():
        return "## The variant study\n\nNot run yet: `python experiments/reproduce.py --only variants`."
    text = page.read_text()
    found = re.search(r"^## Which setting wins where\n\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    winners = found.group(1).strip() if found else ""
    zoology = re.search(r"^## Published anchor: Zoology.*?\n\n.*?\n\n(.*?)(?=^## |^!\[|\Z)", text, re.M | re.S)
    anchor = f"\n\nAssociative recall against Zoology's ordering (full attention ahead of linear):\n\n" \
        f"{zoology.group(1).strip()}" if zoology else ""  # fmt: skip
    return (
        "## The variant study\n\nEvery attention setting in every model family and on the long-range tasks, quality "
        f"next to speed: [variant_study.md](variant_study.md). Best setting per column:\n\n{winners}{anchor}"
    )


OTHER_SCRIPT = "Not written by `experiments/reproduce.py`"  # how a section another script wrote begins


def sections_of_other_scripts(page: Path) -> list[str]:
    """The `## ` sections of an existing results page that another script wrote (their text begins with
    OTHER_SCRIPT): rewriting the page keeps them, so a study run on its own is never erased by this one."""
    text = page.read_text() if page.is_file() else ""
    sections = re.findall(r"^## .*?(?=^## |\Z)", text, re.M | re.S)
    return [section.strip() for section in sections if section.split("\n", 2)[-1].lstrip().startswith(OTHER_SCRIPT)]


def write_results(args, info, summary, attention, speed, out: Path) -> Path:
    measured = ["| figure | measured | target or published anchor |", "|---|---|---|", *attention[1], *speed[1]]
    for row in summary:
        if row["median"] is None:
            continue
        best_of = [r for r in summary if r["label"] == row["label"] and r["median"] is not None]
        lower = "loss" in row["metric"]
        best = min(best_of, key=lambda r: r["median"]) if lower else max(best_of, key=lambda r: r["median"])
        if row is best:
            digits = 1 if "bleu" in row["metric"] else (4 if lower else 3)
            variant = f" ({row['variant']} attention)" if len(best_of) > 1 else ""
            measured.append(f"| {row['label']}{variant} | {fmt(row['median'], digits)} | {row['anchor'] or '-'} |")
    mode = "quick (scaled-down runs: the numbers show the pipeline works, not what the models reach)" if args.quick \
        else "full"  # fmt: skip
    text = [
        "# zoo results",
        f"Written by `python experiments/reproduce.py{' --quick' if args.quick else ''}` ({mode}). Every figure "
        "below is regenerated by that command; speeds are ratios measured side by side in one process, quality "
        f"figures are medians over {args.seeds} seed(s) where a row says runs > 1.",
        table(["machine", ""], [[k, v] for k, v in info.items()]),
        "## Headline\n\nThe figures zoo stands by, the same on README.md and the docs' results page: edit "
        "experiments/results/headline.json (not this table) when a figure below should replace one.\n\n"
        + headline_block(details=True),
        "## Figures of this run\n\n" + "\n".join(measured),
        "## Quality per model and attention variant\n\nWall times are as measured: they depend on what else the "
        "machine ran (each run's log in outputs/reproduce/ says when it ran).\n\n"
        + quality_markdown(summary)
        + "\n\n![quality](quality.png)",
        "## Speed\n\n" + "\n\n".join(part for part in (attention[0], speed[0], kv_memory_markdown(out)) if part),
        variant_study_markdown(out),
        positions_markdown(out),
    ]
    path = out / "RESULTS.md"
    text += sections_of_other_scripts(path)
    path.write_text("\n\n".join(part for part in text if part) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="scaled-down runs: minutes on 2 CPU cores")
    parser.add_argument("--reuse", action="store_true", help="keep runs that already have a metrics.json")
    parser.add_argument("--only", nargs="+", choices=STUDIES, default=list(STUDIES), help="run these studies")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per GPT / digits row (default: full 3, quick 1)")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder holding tinyshakespeare/input.txt and multi30k/")  # fmt: skip
    parser.add_argument("--fashion-mnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--out", type=Path, default=None, help="results folder (default experiments/results[/quick])")
    parser.add_argument("--runs", type=Path, default=ROOT / "outputs" / "reproduce",
                        help="folder for the training runs and their logs (default outputs/reproduce)")  # fmt: skip
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.out = args.out or EXPERIMENTS / "results" / ("quick" if args.quick else "")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    runs_dir = args.runs / mode
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    started = time.perf_counter()

    if "attention" in args.only:
        command = [sys.executable, str(EXPERIMENTS / "attention_benchmark.py"), "--out", str(args.out)]
        if args.quick:
            run_command(
                command + ["--quick", "--lengths", "1024", "2048", "4096"], runs_dir / "attention_benchmark.log"
            )
        else:  # 1 thread timed by its own CPU time (robust to other jobs), then 2 threads by the wall clock
            run_command(
                command + ["--threads", "1", "--timer", "thread", "--flex"], runs_dir / "attention_benchmark.log"
            )
            two = ["--threads", "2", "--out", str(args.out / TWO_THREADS)]
            run_command(command[:2] + two, runs_dir / "attention_benchmark_2threads.log")
    attention = attention_markdown(args.out)

    speed_files = {name: runs_dir / f"{name}.json" for name in ("gpt_throughput", "vit_throughput", "kv_cache")}
    if "speed" in args.only:
        quick_gpt = ["--steps", "20", "--rounds", "2"] if args.quick else ["--rounds", "5", "--compile"]
        quick_vit = ["--depth", "4", "--steps", "3", "--rounds", "2"] if args.quick else ["--rounds", "5"]
        quick_kv = ["--n-layer", "4", "--n-embd", "256", "--n-head", "4", "--new-tokens", "8"] if args.quick else []
        run_script("gpt_throughput.py", quick_gpt, speed_files["gpt_throughput"], runs_dir)
        run_script("vit_throughput.py", quick_vit, speed_files["vit_throughput"], runs_dir)
        run_script("kv_cache_benchmark.py", quick_kv, speed_files["kv_cache"], runs_dir)
        memory = [sys.executable, str(EXPERIMENTS / "kv_cache_memory.py"), "--output", str(args.out / KV_MEMORY)]
        run_command(memory, runs_dir / "kv_cache_memory.log")
    loaded = {k: json.loads(p.read_text()) if p.is_file() else None for k, p in speed_files.items()}
    speed = speed_markdown(loaded["gpt_throughput"], loaded["vit_throughput"], loaded["kv_cache"], args.out)

    if "variants" in args.only:
        command = [sys.executable, str(EXPERIMENTS / "variant_study.py"), "--out", str(args.out), "--shared",
                   str(args.shared), "--fashion-mnist", str(args.fashion_mnist)]  # fmt: skip
        run_command(command + ["--quick"] * args.quick + ["--resume"] * args.reuse, runs_dir / "variant_study.log")

    runs = quality_runs(argparse.Namespace(**{**vars(args), "only": STUDIES}))
    results = {}
    for run in runs:
        if run.study in args.only:
            results[run.name] = run_quality(run, runs_dir, args.reuse)
        elif (runs_dir / run.name / "metrics.json").is_file():  # not asked for: report what an earlier run left
            results[run.name] = run_quality(run, runs_dir, reuse=True)
        else:
            results[run.name] = {"status": "not run"}
    summary = summarise_quality(runs, results)
    plot_quality(summary, args.out / "quality.png")
    path = write_results(args, info, summary, attention, speed, args.out)
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    print(f"\nwrote {shown} in {(time.perf_counter() - started) / 60:.1f} min")
    print(path.read_text().split("## Quality")[0])


if __name__ == "__main__":
    main()
