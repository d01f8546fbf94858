"""From attention to the Transformer, measured: the RNN encoder-decoder (fixed vector, dot attention, additive
attention) against the Transformer on Multi30k de-en, and time per training step against sequence length.

    python experiments/rnn_vs_transformer.py                          # every row, 1 seed (Multi30k; long)
    python experiments/rnn_vs_transformer.py --rows additive --seeds 0,1,2 --epochs 8
    python experiments/rnn_vs_transformer.py --sweep-only             # step time vs length only (minutes)
    python experiments/rnn_vs_transformer.py --quick                  # tiny data and models (seconds; the tests)
    python experiments/rnn_vs_transformer.py --no-sweep --resume      # evaluate finished runs again, no training

Rows: fixed (RNN, model.net.attention=null), dot (RNN, attention=full), additive (RNN, attention=additive),
transformer (experiment=translation_multi30k). Every row trains through `python run.py` on the same data module
and tokenizer settings; the best checkpoint (val BLEU) then decodes test_2016 with beam search and greedily, and
its BLEU is split by source length in words (buckets <=10, 11-15, 16-20, 21-25, >25: Bahdanau et al. 2015, Fig. 2).
The sweep times one training step (forward, backward, Adam) on synthetic pairs of n source and n target tokens,
n = 32 ... 2048, every row at the same width, and fits t ~ n^k on the longer half of the lengths.

Writes experiments/results/rnn_vs_transformer.{md,json} and rnn_vs_transformer_{length,steps}.png (--out
changes the folder). Rows not run keep their "not run yet" entry on the page.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.models.rnn_translation import RNNTranslation, RNNTranslationConfig  # noqa: E402
from zoo.models.translation import TranslationConfig, TranslationTransformer  # noqa: E402

ROWS = {  # row -> (label, run.py overrides for Multi30k)
    "fixed": ("RNN, fixed vector", ["model=rnn_translation", "model.net.attention=null"]),
    "dot": ("RNN + dot attention", ["model=rnn_translation", "attention=full"]),
    "additive": ("RNN + additive attention", ["model=rnn_translation", "attention=additive"]),
    "transformer": ("Transformer (the committed recipe)", ["experiment=translation_multi30k"]),
}
# The seeds' claims and bentrevett/pytorch-seq2seq's Multi30k de-en test BLEU (greedy) as anchors.
ANCHORS = {"fixed": "20.6 (GRU enc-dec)", "dot": "-", "additive": "28.3 (GRU + Bahdanau)", "transformer": "36.5"}
TARGETS = {"fixed": ">= 20.6 greedy", "dot": "-", "additive": ">= 28.3 greedy, >= 30 beam in <= 40 min",
           "transformer": "-"}  # fmt: skip
MULTI30K = [
    "data=multi30k",
    "data.vocab_size=8000",
    "data.max_tokens=2560",
    "data.eval_max_tokens=8192",
    "data.max_length=128",
]  # fmt: skip  (the Transformer recipe's data settings, for every row)
RNN_SIZE = ["model.net.embed_dim=256", "model.net.hidden=256", "model.net.layers=1", "model.net.cell=gru"]
QUICK_DATA = ["data.num_train=64", "data.num_val=8", "data.num_test=16", "data.max_digits=3"]
QUICK_SIZES = {
    "rnn": ["model.net.embed_dim=16", "model.net.hidden=16"],
    "transformer": ["model=translation", "model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32",
                    "model.net.encoder_layers=1", "model.net.decoder_layers=1"],
}  # fmt: skip
BUCKETS = ((0, 10), (11, 15), (16, 20), (21, 25), (26, 10**9))
BUCKET_NAMES = ("<=10", "11-15", "16-20", "21-25", ">25")
LENGTHS = (32, 64, 128, 256, 512, 1024, 2048)


# -- step time against sequence length ------------------------------------------------------------------
def sweep_model(row: str, width: int, vocab: int, max_length: int) -> torch.nn.Module:
    """Every row at the same width: the RNN's hidden and embedding, the Transformer's d_model (3+3 layers,
    8 heads, FFN 2x as the recipe)."""
    if row == "transformer":
        heads = 8 if width % 8 == 0 else 2
        config = TranslationConfig(vocab_size=vocab, dim=width, num_heads=heads, mlp_dim=2 * width, dropout=0.0,
                                   max_length=max_length + 2)  # fmt: skip
        return TranslationTransformer(config)
    attention = {"fixed": None, "dot": "full", "additive": "additive"}[row]
    config = RNNTranslationConfig(vocab_size=vocab, embed_dim=width, hidden=width, attention=attention, dropout=0.0,
                                  max_length=max_length + 2)  # fmt: skip
    return RNNTranslation(config)


def step_time_sweep(
    rows: list[str],
    lengths: tuple[int, ...] = LENGTHS,
    width: int = 256,
    batch: int = 1,
    repeats: int = 3,
    device: str | torch.device = "cpu",
    max_seconds: float = 60.0,
) -> dict:
    """Median seconds of one training step (forward, backward, Adam) per row and length on random pairs of
    n source and n target tokens, and the fitted exponent k of t ~ n^k over the longer half of the lengths.
    A row stops at the first length whose step takes over max_seconds (later lengths: None). Callable on any
    device (experiments/gpu_check.py runs it on CUDA).

    On the CPU the step runs on one thread and is timed by that thread's CPU time (time.thread_time): on a
    shared machine a two-thread step spends most of its wall time waiting at barriers for a descheduled
    thread (an RNN has thousands of small parallel regions), which measures the neighbours, not the model.
    On CUDA: wall time after synchronising."""
    device = torch.device(device)
    cpu = device.type == "cpu"
    clock = time.thread_time if cpu else time.perf_counter
    threads = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    vocab = 1000
    generator = torch.Generator().manual_seed(0)
    timer = "CPU time of one thread" if cpu else "wall time"
    result: dict = {"lengths": list(lengths), "width": width, "batch": batch, "device": str(device), "timer": timer}
    result["seconds"] = {}
    for row in rows:
        torch.manual_seed(0)
        model = sweep_model(row, width, vocab, max(lengths)).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        times: list[float | None] = []
        for n in lengths:
            if times and (times[-1] is None or times[-1] > max_seconds):
                times.append(None)
                continue
            src = torch.randint(3, vocab, (batch, n), generator=generator).to(device)
            tgt = torch.randint(3, vocab, (batch, n + 1), generator=generator).to(device)
            samples = []
            for i in range(repeats + 1):  # the first is a warm-up
                start = clock()
                logits = model(src, tgt[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                elapsed = clock() - start
                if i > 0 or elapsed > max_seconds:
                    samples.append(elapsed)
                if elapsed > max_seconds:
                    break
            times.append(statistics.median(samples))
            print(f"step time: {row} n={n} {times[-1]:.4f} s", flush=True)
        result["seconds"][row] = times
    torch.set_num_threads(threads)
    result["exponents"] = {row: fitted_exponent(lengths, times) for row, times in result["seconds"].items()}
    result["crossing"] = crossing(result)
    return result


def fitted_exponent(lengths, times) -> float | None:
    """Least-squares slope of log t against log n over the longer half of the measured lengths."""
    points = [(math.log(n), math.log(t)) for n, t in zip(lengths, times) if t]
    points = points[len(points) // 2 :] if len(points) >= 4 else points
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def crossing(sweep: dict) -> dict:
    """Per RNN row, the lengths at which its step is cheaper than the Transformer's (where recurrence wins)."""
    seconds = sweep["seconds"]
    if "transformer" not in seconds:
        return {}
    return {
        row: [n for n, t, u in zip(sweep["lengths"], times, seconds["transformer"]) if t and u and t < u]
        for row, times in seconds.items()
        if row != "transformer"
    }


# -- training rows -------------------------------------------------------------------------------------
def row_overrides(row: str, seed: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    overrides = list(ROWS[row][1])
    if args.quick:
        overrides = [o for o in overrides if not o.startswith("experiment=")]
        overrides += QUICK_SIZES["transformer"] if row == "transformer" else QUICK_SIZES["rnn"]
        overrides += QUICK_DATA + ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "model.beam_size=2"]
    else:
        overrides += MULTI30K + [f"data.data_dir={args.data_dir}"]
        overrides += [] if row == "transformer" else RNN_SIZE
        if args.epochs is not None:
            overrides.append(f"trainer.max_epochs={args.epochs}")
    return overrides + [f"seed={seed}", "print_config=false", "logger=csv", f"hydra.run.dir={run_dir}"]


def train_row(row: str, seed: int, args: argparse.Namespace) -> dict:
    """Train one row through run.py (or, with --resume, take the finished run already in its folder) and evaluate
    its best checkpoint."""
    run_dir = Path(args.runs) / f"{row}_seed{seed}"
    overrides = row_overrides(row, seed, args, run_dir)
    if args.resume and (run_dir / "metrics.json").is_file():
        wall = logged_wall(run_dir)
    else:
        start = time.perf_counter()
        env = {**os.environ, "WANDB_MODE": "offline"}
        done = subprocess.run([sys.executable, str(ROOT / "run.py"), *overrides], cwd=ROOT, env=env, text=True,
                              capture_output=True)  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"row {row} seed {seed} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    checkpoints = sorted((run_dir / "checkpoints").glob("epoch*.ckpt")) or [run_dir / "checkpoints" / "last.ckpt"]
    record = {"row": row, "seed": seed, "wall_s": wall, "overrides": overrides, "metrics": metrics,
              "val_curve": val_curve(run_dir)}  # fmt: skip
    record |= evaluate(checkpoints[-1], overrides, args)
    return record


LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")
VAL_LINE = re.compile(r"val samples \(epoch (\d+)\)")


def _log_times(run_dir: Path) -> list[tuple[datetime, str]]:
    log = run_dir / "run.log"
    if not log.is_file():
        raise SystemExit(f"{run_dir} holds no run.log: not a run of run.py (train it without --resume)")
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if found := LOG_TIME.match(line):
            times.append((datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S"), line))
    return times


def logged_wall(run_dir: Path) -> float:
    """Seconds from the run's first log line to its metrics.json (fit and test): a finished run's wall time."""
    times = _log_times(run_dir)
    if not times:
        raise SystemExit(f"{run_dir / 'run.log'} has no timestamped line: its wall time cannot be read")
    first = times[0][0]  # logging writes local time, as timestamp() reads it
    return (run_dir / "metrics.json").stat().st_mtime - first.timestamp()


def val_curve(run_dir: Path) -> list[dict]:
    """Val BLEU per epoch with the minutes since the run's first log line at which that epoch's validation began
    (the task logs its sample translations there, once per epoch): training time, not counting the validation
    that measured it."""
    times = _log_times(run_dir)
    if not times:
        return []
    started, minutes = times[0][0], {}
    for when, line in times:
        if found := VAL_LINE.search(line):
            minutes[int(found.group(1))] = (when - started).total_seconds() / 60
    bleu = {}
    for path in sorted((run_dir / "csv").rglob("metrics.csv")):
        with path.open() as handle:
            for entry in csv.DictReader(handle):
                if entry.get("val/bleu"):
                    bleu[int(entry["epoch"])] = float(entry["val/bleu"])
    return [{"epoch": e, "minutes": minutes[e], "val_bleu": bleu[e]} for e in sorted(bleu) if e in minutes]


def minutes_to(curve: list[dict], bleu: float) -> float | None:
    """Training minutes until the val BLEU first reached `bleu` (None: never)."""
    return next((point["minutes"] for point in curve if point["val_bleu"] >= bleu), None)


def evaluate(checkpoint: Path, overrides: list[str], args: argparse.Namespace) -> dict:
    """Test-set BLEU (beam and greedy) by source-length bucket, parameters and training tokens/s of a checkpoint."""
    import hydra
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import zoo
    from zoo.data.parallel_text import decode_ids, pad_sequences
    from zoo.models.seq2seq import beam_search, greedy_decode
    from zoo.tasks.translation import corpus_bleu, label_smoothed_cross_entropy

    model = zoo.load(checkpoint)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        keep = [o for o in overrides if o.split("=")[0].split(".")[0] in ("data", "experiment", "model")]
        cfg = compose("config", overrides=[o for o in keep if not o.startswith("model.")] + ["paths.data_dir=."])
    data = hydra.utils.instantiate(cfg.data, _convert_="all")
    data.use_tokenizer(model.tokenizer)
    test = data.dataset("test")
    settings = model.settings
    options = dict(max_len_a=settings.get("max_len_a", 1.2), max_len_b=settings.get("max_len_b", 10))
    hypotheses: dict[str, list[str]] = {"beam": [], "greedy": []}
    order = sorted(range(len(test)), key=lambda i: len(test.source[i]))  # similar lengths in a batch
    for start in range(0, len(order), args.eval_batch):
        rows = order[start : start + args.eval_batch]
        src = pad_sequences([test.source[i] for i in rows], model.config.pad_id)
        beam_size, length_penalty = int(settings.get("beam_size", 5)), settings.get("length_penalty", 1.0)
        beam = beam_search(model, src, beam_size, length_penalty, **options)
        greedy = greedy_decode(model, src, **options)
        hypotheses["beam"] += [decode_ids(model.tokenizer, ids) for ids in beam]
        hypotheses["greedy"] += [decode_ids(model.tokenizer, ids) for ids in greedy]
    references = [test.target_text[i] for i in order]
    words = [len(test.source_text[i].split()) for i in order]
    result = {"parameters": sum(p.numel() for p in model.parameters()), "test_sentences": len(order)}
    for name, texts in hypotheses.items():
        result[f"bleu_{name}"] = corpus_bleu(texts, references)
        result[f"bleu_{name}_by_length"] = {}
        for bucket, (low, high) in zip(BUCKET_NAMES, BUCKETS):
            picked = [i for i, n in enumerate(words) if low <= n <= high]
            if picked:
                score = corpus_bleu([texts[i] for i in picked], [references[i] for i in picked])
                result[f"bleu_{name}_by_length"][bucket] = {"bleu": score, "sentences": len(picked)}
    # Training tokens/s: forward, backward and Adam on the first training batches, the model as trained.
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-6)
    train = data.dataset("train")
    starts = [s for s in (0, 64, 128) if s < len(train)]
    batches = [data.collate([train[i] for i in range(s, min(s + 64, len(train)))]) for s in starts]
    tokens, seconds = 0, 0.0
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        logits = model(batch["src"], batch["tgt"][:, :-1])
        loss, _ = label_smoothed_cross_entropy(logits, batch["tgt"][:, 1:], 0.1, model.config.pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i > 0 or len(batches) == 1:
            seconds += time.perf_counter() - start
            tokens += int((batch["tgt"][:, 1:] != model.config.pad_id).sum())
    result["train_tokens_per_s"] = tokens / seconds if seconds else None
    return result


# -- the page ------------------------------------------------------------------------------------------
def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "not run yet"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def mean_of(records: list[dict], key: str):
    values = [r[key] for r in records if r.get(key) is not None]
    if not values:
        return None
    mean = statistics.mean(values)
    return f"{mean:.1f} ± {statistics.stdev(values):.1f} (n={len(values)})" if len(values) > 1 else f"{mean:.1f} (n=1)"


def write_page(results: dict, out: Path, quick: bool) -> Path:
    host = results["host"]
    lines = [
        "# RNN encoder-decoder vs Transformer (issue 48)",
        "",
        f"`python experiments/rnn_vs_transformer.py{' --quick' if quick else ''}` on {host['cpu']} "
        f"({host['threads']} torch threads, torch {host['torch']}), {host['date']}, load average "
        f"{fmt(host.get('load'))} at the start (a shared machine: absolute times scale with the load)."
        + (" **Quick mode: tiny data and models, the figures say nothing about the models.**" if quick else ""),
        "",
        "## Training rows (Multi30k de-en, test_2016_flickr)",
        "",
    ]
    # The yardstick of "wall to the RNN-with-attention's best BLEU": the additive row's best val BLEU (first seed).
    yardstick = [r for r in results["training"].get("additive", []) if r.get("val_curve")]
    target_bleu = max(p["val_bleu"] for p in yardstick[0]["val_curve"]) if yardstick else None
    reach = f"minutes to val BLEU {target_bleu:.1f}" if target_bleu is not None else "minutes to additive's best"
    lines += [
        f"| row | parameters | BLEU beam | BLEU greedy | anchor (greedy) | target | best val BLEU | {reach} | "
        "train tokens/s | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sources = []
    for row, (label, _) in ROWS.items():
        records = results["training"].get(row, [])
        params = records[0]["parameters"] if records else None
        wall = mean_of(records, "wall_s")
        curve = records[0].get("val_curve", []) if records else []
        best = max((p["val_bleu"] for p in curve), default=None)
        minutes = minutes_to(curve, target_bleu) if curve and target_bleu is not None else None
        absent = "not measured" if records else "not run yet"
        reached = fmt(minutes) if minutes is not None else ("not reached" if curve else absent)
        mark = ""
        if records and records[0].get("source"):
            sources.append(f"{label}: {records[0]['source']}")
            mark = f" [{len(sources)}]"
        lines.append(
            f"| {label}{mark} | {fmt(params)} | {mean_of(records, 'bleu_beam') or 'not run yet'} | "
            f"{mean_of(records, 'bleu_greedy') or 'not run yet'} | {ANCHORS[row]} | {TARGETS[row]} | "
            f"{fmt(best)} | {reached} | {mean_of(records, 'train_tokens_per_s') or absent} | {wall or absent} |"
        )
    if target_bleu is not None:
        lines += ["", f"Minutes: training time until that validation began (from the run's log), the first epoch whose "
                  f"val BLEU (greedy) reached the additive row's best, {target_bleu:.1f}."]  # fmt: skip
    lines += ([""] + [f"[{i}] {text}" for i, text in enumerate(sources, 1)]) if sources else []
    lines += ["", "## BLEU by source length (words; beam)", "", "| row | " + " | ".join(BUCKET_NAMES) + " |",
              "|---|" + "---|" * len(BUCKET_NAMES)]  # fmt: skip
    for row, (label, _) in ROWS.items():
        records = results["training"].get(row, [])
        cells = []
        for bucket in BUCKET_NAMES:
            scores = [r["bleu_beam_by_length"][bucket]["bleu"] for r in records if bucket in r["bleu_beam_by_length"]]
            cells.append(f"{statistics.mean(scores):.1f}" if scores else ("not measured" if records else "not run yet"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if results["training"]:
        lines += ["", "![BLEU by source length](rnn_vs_transformer_length.png)"]
    sweep = results.get("sweep")
    lines += ["", "## Time per training step against sequence length (synthetic pairs)", ""]
    if sweep:
        lines += [
            f"One step (forward, backward, Adam) on a batch of {sweep['batch']} pair(s) of n source and n target "
            f"tokens, width {sweep['width']} for every row, on {sweep['device']}; median of the timed repeats, "
            f"seconds ({sweep.get('timer', 'wall time')}). Exponent k: least-squares fit of t ~ n^k over the longer "
            "half of the lengths.",
            "",
            "| row | " + " | ".join(str(n) for n in sweep["lengths"]) + " | k |",
            "|---|" + "---|" * (len(sweep["lengths"]) + 1),
        ]
        for row, times in sweep["seconds"].items():
            cells = [f"{t:.3g}" if t else "-" for t in times]
            lines.append(f"| {ROWS[row][0]} | " + " | ".join(cells) + f" | {fmt(sweep['exponents'][row], 2)} |")
        for row, cheaper in sweep["crossing"].items():
            where = f"at n = {', '.join(map(str, cheaper))}" if cheaper else "at none of these lengths"
            lines.append(f"\n{ROWS[row][0]}: its step is cheaper than the Transformer's {where}.")
        lines += ["", "![step time against length](rnn_vs_transformer_steps.png)"]
    else:
        lines.append("not run yet")
    lines += ["", "## The seeds' table, with what was measured", "", *claims(results), ""]
    missing = [row for row in ROWS if row not in results["training"]]
    if missing:
        lines += [
            f"Not run yet: the training rows {', '.join(missing)} (Multi30k). They run with "
            f"`python experiments/rnn_vs_transformer.py --no-sweep --rows {','.join(missing)} --seeds 0,1,2`; the "
            "entries above that say so are not measured.",
            "",
        ]
    if results.get("notes"):
        lines += ["## Notes on these runs", "", *results["notes"], ""]
    page = out / "rnn_vs_transformer.md"
    page.write_text("\n".join(lines) + "\n")
    return page


def claims(results: dict) -> list[str]:
    sweep = results.get("sweep") or {"exponents": {}}
    exponent = lambda row: fmt(sweep["exponents"].get(row), 2)  # noqa: E731
    # Long-range: beam BLEU of the shortest against the longest bucket that holds enough sentences to mean something.
    spans = []
    for row in ROWS:
        records = results["training"].get(row, [])
        buckets = records[0].get("bleu_beam_by_length", {}) if records else {}
        enough = [b for b in BUCKET_NAMES if buckets.get(b, {}).get("sentences", 0) >= 20]
        if len(enough) >= 2:
            first, last = buckets[enough[0]]["bleu"], buckets[enough[-1]]["bleu"]
            spans.append(f"{row} {first:.1f} -> {last:.1f}")
    long_range = (f"beam BLEU, {BUCKET_NAMES[0]} -> longest bucket of >= 20 sentences: " + "; ".join(spans)) if spans \
        else "BLEU by source length above"  # fmt: skip
    parallel = "tokens/s above"
    times = sweep.get("seconds", {})
    if times.get("transformer") and times["transformer"][-1]:
        ratios = [times[row][-1] / times["transformer"][-1] for row in ("fixed", "dot", "additive") if times.get(row)
                  and times[row][-1]]  # fmt: skip
        if ratios:
            parallel = (f"the Transformer's training step {min(ratios):.1f}-{max(ratios):.1f}x cheaper than the RNN "
                        f"rows' at n = {sweep['lengths'][-1]} (sweep below)")  # fmt: skip
    return [
        "| claim | RNN / LSTM | Transformer | measured here |",
        "|---|---|---|---|",
        f"| long-range dependencies | hard | direct | {long_range} |",
        f"| parallel training | no | yes | {parallel} |",
        f"| cost per layer | O(n) | O(n^2) | step-time exponent: RNN fixed {exponent('fixed')}, dot "
        f"{exponent('dot')}, additive {exponent('additive')}; Transformer {exponent('transformer')} |",
    ]


def plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if results["training"]:
        figure, axis = plt.subplots(figsize=(6, 4))
        counts = {}
        for row, records in results["training"].items():
            points = [(i, r["bleu_beam_by_length"][b]["bleu"]) for r in records[:1]
                      for i, b in enumerate(BUCKET_NAMES) if b in r["bleu_beam_by_length"]]  # fmt: skip
            for r in records[:1]:
                counts |= {b: v["sentences"] for b, v in r["bleu_beam_by_length"].items()}
            if points:  # a row without measured buckets stays out of the legend
                axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=ROWS[row][0])
        # Each bucket's sentence count under its name: a bucket of a few sentences is noise, and the plot says so.
        ticks = [f"{b}\n(n={counts[b]})" if b in counts else b for b in BUCKET_NAMES]
        axis.set_xticks(range(len(BUCKET_NAMES)), ticks)
        axis.set_xlabel("source sentence length (words)")
        axis.set_ylabel("test BLEU (beam)")
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / "rnn_vs_transformer_length.png", dpi=120)
        plt.close(figure)
    sweep = results.get("sweep")
    if sweep:
        figure, axis = plt.subplots(figsize=(6, 4))
        for row, times in sweep["seconds"].items():
            points = [(n, t) for n, t in zip(sweep["lengths"], times) if t]
            k = sweep["exponents"][row]
            label = f"{ROWS[row][0]} (k={k:.2f})" if k is not None else ROWS[row][0]
            axis.loglog([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        axis.set_xlabel("sequence length n (source = target)")
        axis.set_ylabel("seconds per training step")
        axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(out / "rnn_vs_transformer_steps.png", dpi=120)
        plt.close(figure)


def host() -> dict:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # a shared machine: timings scale with it
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "date": date, "load": load}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds of each training row")
    parser.add_argument("--epochs", type=int, default=None, help="trainer.max_epochs (default: each row's config)")
    parser.add_argument("--quick", action="store_true", help="tiny data and models, short sweep: seconds")
    parser.add_argument("--sweep-only", action="store_true", help="only the step-time sweep")
    parser.add_argument("--no-sweep", action="store_true", help="only the training rows")
    parser.add_argument("--lengths", default=None, help="sweep lengths, comma-separated (default 32 ... 2048)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per length (after one warm-up)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="a row stops after a step this long")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument(
        "--resume",
        action="store_true",
        help="a row whose run folder holds a finished run is evaluated again, not retrained",
    )
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--runs", default=str(ROOT / "outputs" / "rnn_vs_transformer"))
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    for row in rows:
        if row not in ROWS:
            raise SystemExit(f"unknown row {row!r}; valid choices: {', '.join(ROWS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "rnn_vs_transformer.json"
    results = json.loads(record.read_text()) if record.is_file() and not args.quick else {"training": {}}
    results["host"] = host()
    if not args.no_sweep:
        lengths = tuple(int(n) for n in args.lengths.split(",")) if args.lengths else LENGTHS
        if args.quick:
            lengths, width = (lengths if args.lengths else (8, 16, 32, 64)), 16
        else:
            width = args.width
        repeats = 1 if args.quick else args.repeats
        results["sweep"] = step_time_sweep(rows, lengths, width, repeats=repeats, max_seconds=args.max_seconds)
        print(json.dumps({"exponents": results["sweep"]["exponents"]}, indent=1))
    if not args.sweep_only:
        for row in rows:
            results["training"][row] = [train_row(row, seed, args) for seed in seeds]
            print(row, [(r["bleu_beam"], r["bleu_greedy"]) for r in results["training"][row]])
    record.write_text(json.dumps(results, indent=1) + "\n")
    plots(results, out)
    print(f"wrote {write_page(results, out, args.quick)}")
    return results


if __name__ == "__main__":
    main()
