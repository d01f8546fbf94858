"""The variant study: every attention variant and position option of zoo, in every model family and on the
long-range tasks, quality next to speed, measured on one machine by one command.

    python experiments/variant_study.py --quick     # scaled down, rows full and linear: under 10 minutes
    python experiments/variant_study.py --quick --rows full local   # other rows, scaled down: minutes a row
    python experiments/variant_study.py             # the study (hours on 2 CPU cores)
    python experiments/variant_study.py --resume    # keep the jobs that have a record, run the rest
    python experiments/variant_study.py --reuse     # the page from the ledger alone: runs nothing
    python experiments/variant_study.py --rows full local --tasks vit_digits lra_listops

Rows are read from the registry and the config types, so variants and options that land later join without an
edit here (discover_rows): every kernel of zoo.attention.registry.VARIANTS (with its conf/attention/<name>.yaml),
every other conf/attention/*.yaml (rope = full + rotary positions), every AttentionConfig setting that is off by
default or has named choices (AttentionConfig.setting_choices) on the first row that takes it, every kernel option's
named choices (Kernel.option_choices) on its kernel, and the ANTICIPATED options. Rows with the same effective
AttentionConfig are one row.

Columns (tasks()): one `zoo.app.run` job per row, column and seed, in this process. Each cell gets 5 seeds where its
first job takes under 2 minutes, else 3 (study_stats; --quick: 1), seed n the same for every row; a cell shows the
median, a 95% bootstrap interval and, where one row's interval excludes every other median, the winner
(study_stats.verdict). A job that exits with a one-line error (a row that cannot run a task by definition) shows
that line. Besides the columns: the GPT at 4x its block, the class prior of the classifications, the step time of
the long-range classifier (`speed`) and each row's step cost on each column (`cost`, experiments/step_cost.py).

The ledger, <results>/variant_study_runs/ (committed with the page), holds every job that ended with a number or a
one-line error (<task>/<row>-seed<n>.json, the 4x evaluation beside it as .extrapolation.json) and the study's
own measurements (speed.json, cost.json, prior.json). --resume takes jobs from it, so the study runs a few rows or
tasks at a time; --reuse writes the page, experiments/results/variant_study.{md,json,png}, from it alone. Job
folders: outputs/variant_study/<quick|full>/<task>/<row>-seed<n>/. The page's words (how to read a cell, the method,
the anchors) are experiments/variant_study_page.md's; this file computes its tables, verdicts and figure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `python experiments/variant_study.py`
    sys.path.insert(0, str(ROOT))

import zoo.app  # noqa: E402
from experiments.listops_recipe import CANDIDATES, COMMON  # noqa: E402
from experiments.reproduce import IDX_FILES, fmt, machine, table  # noqa: E402
from experiments.study_stats import Cell, seeds_required, verdict  # noqa: E402

CONF = ROOT / "conf"
# Options without named choices worth a row of their own, and the value to try: multi-query attention, one
# Longformer global token, StreamingLLM's 4 attention sinks.
ANTICIPATED = {"kv_heads": 1, "global_tokens": 1, "sink_tokens": 4}
# How attention is computed, not what: the same numbers by definition (the attention benchmark compares them).
IMPLEMENTATION = {"backend"}
STOPPED_BY_SIGNAL = {130: "Ctrl-C", 138: "SIGUSR1", 143: "SIGTERM"}  # run.py's exit statuses (README)
# Settings an option changes nothing without: RoPE scaled by 1 is plain RoPE; 4 is the factor of the 4x column.
COMPANIONS = {"rope_scaling": {"rope_factor": 4.0}}
# Local attention's window on the short tasks (17 image tokens; 16-token captions and numbers), where
# conf/attention/local.yaml's 256 would make it exactly full attention: half the sequence, as GPT_WINDOW of the
# GPT recipe's block of 64.
SHORT_WINDOW = 8
GPT_WINDOW = 32
# The long-range columns train on a fixed budget, as Long Range Arena does: their experiment configs' epochs, times
# every row, take days on 2 CPU cores (full attention: 0.92 s a step at n=784, 5.2 s at n=2000, batch 32).
PIXEL_STEPS = 500  # 16k of the 54k training images: ~8 min of full-attention training a job
LISTOPS_TRAIN = 4800  # expressions, one epoch (150 steps): ~13 min of full-attention training a job
LRA_VAL_BATCHES = 4  # validation is only watched (the classifier tests its last weights)
# ListOps that learns: the recipe experiments/listops_recipe.py found (results/listops_recipe.md).
LISTOPS_CHOICE = "len256_lr3e-4_b32"
LISTOPS_RECIPE = (
    *(o for o in COMMON if o.startswith(("data.", "trainer.limit_val"))),
    *(o for o in CANDIDATES[LISTOPS_CHOICE] if not o.startswith("trainer.val_check_interval")),
)
LISTOPS_LENGTH = int(next(o for o in LISTOPS_RECIPE if o.startswith("data.max_length=")).split("=")[1])
# MQAR: Zoology's smallest setting (64 tokens, 4 pairs, widths 64 and 128, one head) with its quick-start vocabulary
# and training set; larger settings kept full attention itself at the plateau (results/variant_study_checks.md).
# (sequence length, key-value pairs, model widths, budget); --quick: width 64, 60 steps.
MQAR = (64, 4, (64, 128), ("data.vocab_size=128", "data.num_train=10000", "trainer.max_steps=2000",
                           "trainer.val_check_interval=500"))  # fmt: skip
MQAR_QUICK = (64, 4, (64,), ("data.vocab_size=256", "data.num_train=2000", "data.num_test=200", "trainer.max_steps=60",
                             "trainer.val_check_interval=60"))  # fmt: skip
QUICK_ROWS = ("full", "linear")  # --quick without --rows: attention and its best-known substitute
LEDGER = "variant_study_runs"  # beside the results: every finished job's record (see the module docstring)
# The cost of a row on a column (--tasks cost): its job, seed 0, cut to COST_STEPS training steps without validation
# or test (experiments/step_cost.StepCost): a step's cost is set by the shapes, not by how long training runs.
COST_STEPS = 10
COST = "cost.json"  # the ledger's record of the cost pass: {task: {row: record}}
# Kernels made faster after some of their step timings were recorded: row -> (the date it landed, the page that
# measures it). A timing of that row recorded before the date carries a footnote saying so.
KERNEL_CHANGES = {
    "additive": ("2026-12-07 12:37", "experiments/results/additive_speed.md"),  # its CPU fast path
    "lsh": ("2026-12-07 12:51", "experiments/results/content_attention.md"),  # two fewer passes over its masks
}
# n -> (vocabulary, padding id): the pixel task, LRA's ListOps, the learning ListOps column
SPEED_SHAPES = {784: (256, None), 2000: (16, 0), 256: (16, 0)}
# Kernels whose cost grows too fast to train or time at every length: the longest n they run at. Additive attention
# evaluates tanh(W q + U k) for every (query, key) pair, n^2 * head_dim values a head: 500 pixel-task steps would take
# hours a job (variant_study_checks.md, "Additive attention at the pixel task's length"). Jobs, speed table and cost
# pass stop at the same length, with the same reason (beyond_longest).
SPEED_LONGEST = {"additive": 256}
# Long Range Arena, Tay et al. 2021, Table 1 (accuracy %, the LRA repository's leaderboard of 8 Nov 2020): ListOps
# (up to 2000 tokens) and Image (CIFAR-10 as 1024 grey pixels), with the row of ours each matches.
LRA_TABLE_1 = {
    "Transformer": {"ListOps": 36.37, "Image": 42.44, "rows": ("full",)},
    "Local Attention": {"ListOps": 15.82, "Image": 41.46, "rows": ("local",)},
    "Linformer": {"ListOps": 35.70, "Image": 38.56, "rows": ("compressed",)},
    "Sparse Transformer": {"ListOps": 17.07, "Image": 44.24, "rows": ("sparse",)},
    "Linear Transformer": {"ListOps": 16.13, "Image": 42.34, "rows": ("linear",)},
    "Performer": {"ListOps": 18.01, "Image": 42.77, "rows": ("favor", "linear+favor")},
}
# Zoology (Arora et al. 2023, Figure 2): attention solves MQAR at width 64 where efficient substitutes fall short.
ZOOLOGY = {"attention": "full", "substitute": "linear"}
EXTRAPOLATION = "gpt_char@4x"  # the GPT's val loss at 4x its training block (a column of its own)
PLAIN_ROPE = "rope"
# RoPE scalings that change nothing within the trained block (dynamic NTK scales only a longer input): such a row
# trains exactly as the PLAIN_ROPE row, so its training cells are that row's jobs, after a one-batch run of its own.
PLAIN_WITHIN_BLOCK = {"dynamic"}
# RoPE scalings evaluated at 4x on the PLAIN_ROPE row's weights, as their users apply them (at inference).
SCALED_AT_INFERENCE = {"linear", "ntk", *PLAIN_WITHIN_BLOCK}
NOT_RUN = {"status": "not run", "reason": "not run yet"}  # --reuse: a job without a record


# -- rows: the attention settings, read from the registry and the config types ---------------------------------
@dataclass(frozen=True)
class Row:
    name: str
    overrides: tuple[str, ...]  # what selects it on the command line
    attention: dict  # its effective AttentionConfig, flat (the speed benchmark builds it directly)
    origin: str  # where it was found


def text(value: object) -> str:
    """A value as a command-line override writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def discover_rows() -> tuple[list[Row], list[str]]:
    """(rows, notes on candidates left out and why)."""
    from zoo.app.overrides import group_option, group_options
    from zoo.attention import VARIANTS, AttentionConfig

    rows: list[Row] = []
    notes: list[str] = []
    named = group_options("attention")

    def base(name: str) -> tuple[list[str], dict, str]:
        if name in named:
            return [f"attention={name}"], group_option("attention", name), f"conf/attention/{name}.yaml"
        return [f"attention.variant={name}"], {"variant": name}, "zoo.attention.registry.VARIANTS"

    def add(name: str, overrides: list[str], attention: dict, origin: str) -> None:
        try:
            effective = AttentionConfig(**{k: v for k, v in attention.items() if k != "_target_"}).to_dict()
        except ValueError as error:
            notes.append(f"{name} ({origin}): {' '.join(str(error).split())}")
            return
        if all(row.attention != effective for row in rows):
            rows.append(Row(name, tuple(overrides), effective, origin))

    def add_on_first_base(option: str, value: object, label: str, origin: str) -> None:
        """option=value on the first row found so far that takes it (full; or rope, for an option of RoPE)."""
        changes = {option: value, **COMPANIONS.get(option, {})}
        for row in rows[:bases]:
            settings = {**row.attention, **changes}
            with contextlib.suppress(ValueError):
                config = AttentionConfig(**settings)
                if option not in {*AttentionConfig.setting_names(), *VARIANTS[config.variant].option_names()}:
                    continue  # a kernel option another kernel ignores: not this row's
                config.build_kernel()  # the kernel's own checks (e.g. sinks need a window)
                overrides = [*row.overrides, *(f"++attention.{k}={text(v)}" for k, v in changes.items())]
                add(f"{row.name}+{label}", overrides, settings, origin)
                return
        notes.append(f"{label} ({origin}): no row takes {option}={value}")

    bases_of = {variant: base(variant) for variant in VARIANTS}
    for variant in VARIANTS:
        add(variant, *bases_of[variant])
    for name in named:
        if name not in VARIANTS:
            add(name, *base(name))
    bases = len(rows)  # the variants and named settings: what an option is tried on
    shared = [f for f in fields(AttentionConfig) if f.name in AttentionConfig.setting_names() and f.name != "variant"]
    for name in sorted(IMPLEMENTATION & {f.name for f in shared}):
        notes.append(f"{name} (AttentionConfig.{name}): an implementation choice, same results; no row")
    choices = AttentionConfig.setting_choices()
    for setting in (f for f in shared if f.name not in IMPLEMENTATION):
        origin = f"AttentionConfig.{setting.name}"
        if setting.default is False:
            add_on_first_base(setting.name, True, setting.name, origin)
        for choice in choices.get(setting.name, ()):
            if choice != setting.default:
                add_on_first_base(setting.name, choice, choice, origin)
    for variant, kernel in VARIANTS.items():
        overrides, attention, _ = bases_of[variant]
        defaults = kernel.option_defaults()
        for name, options in kernel.option_choices().items():
            for choice in (c for c in options if c != defaults[name] and name not in IMPLEMENTATION):
                add(f"{variant}+{choice}", [*overrides, f"++attention.{name}={choice}"], {**attention, name: choice},
                    f"{kernel.__name__}.{name}")  # fmt: skip
    known = {f.name for f in shared} | {name for kernel in VARIANTS.values() for name in kernel.option_names()}
    for name, value in ANTICIPATED.items():
        if name in known:
            add_on_first_base(name, value, f"{name}={value}", f"ANTICIPATED: {name}")
    return rows, notes


def beyond_longest(row: Row, n: int | None, verb: str) -> str | None:
    """Why `row` is not `verb` (run, timed, measured) at length n (SPEED_LONGEST), or None where it is."""
    variant = row.attention.get("variant")
    longest = SPEED_LONGEST.get(variant)
    if longest is None or (n or 0) <= longest:
        return None
    return f"not {verb} beyond n={longest}: {variant} attention's step grows as n^2 * d"


# -- columns: the tasks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    key: str
    title: str  # column header
    metric: str  # the metrics.json key reported
    higher_is_better: bool
    overrides: tuple[str, ...]
    needs: tuple[Path, ...] = ()  # files that must exist (else the column is skipped, with the reason)
    digits: int = 3
    window: int | None = None  # local attention's window here, where the default covers the whole sequence
    prior: bool = False  # a classification whose test set's most common class share is shown beside the rows
    length: int | None = None  # the longest sequence of the long-range columns (SPEED_LONGEST applies to it)


def replaced(overrides: tuple[str, ...], *changes: str) -> tuple[str, ...]:
    """`overrides` with `changes` in place of the overrides of the same keys (a key given twice is ambiguous)."""
    keys = {change.split("=", 1)[0].lstrip("+") for change in changes}
    return (*(o for o in overrides if o.split("=", 1)[0].lstrip("+") not in keys), *changes)


def tasks(args: argparse.Namespace) -> list[Task]:
    quick = args.quick
    shakespeare = args.shared / "tinyshakespeare" / "input.txt"
    fashion = [args.fashion_mnist / f"{name}*" for name in IDX_FILES]  # plain or .gz
    return [
        Task("vit_digits", "ViT digits (test acc)", "test/acc", True,
             ("model=vit", *(["trainer.max_epochs=3"] if quick else [])), window=SHORT_WINDOW),
        Task("gpt_char", "GPT tiny-shakespeare char (val loss)", "val/loss", False,
             ("experiment=gpt_shakespeare_char", f"data.path={shakespeare}", "model.compile=false",  # trained eager
              *(["trainer.max_steps=60", "trainer.val_check_interval=60", "data.eval_batches=20",
                 "model.sample.max_new_tokens=0"] if quick else [])), (shakespeare,), 4, window=GPT_WINDOW),
        Task("translation_numbers", "Transformer numbers de-en (test BLEU)", "test/bleu", True,
             ("model=translation", *(["data.num_train=600", "data.num_val=40", "data.num_test=40", "model.beam_size=1",
                                      "model.alignment_plots=false", "trainer.max_epochs=1"] if quick else [])),
             digits=1, window=SHORT_WINDOW),
        Task("clip_digits", "CLIP digits (zero-shot top-1)", "test/zero_shot_top1", True,
             ("model=clip", *(["trainer.max_epochs=2"] if quick else [])), window=SHORT_WINDOW),
        Task("lra_pixel", "pixel sequence " + ("digits, 64 tokens" if quick else
                                               f"Fashion-MNIST, 784 tokens, {PIXEL_STEPS} steps") + " (test acc)",
             "test/acc", True,
             ("experiment=lra_pixel", *(["data=pixel_sequence_digits", "trainer.max_epochs=2"]
                                        if quick else [f"data.images.data_dir={args.fashion_mnist}",
                                                       f"trainer.max_steps={PIXEL_STEPS}",
                                                       f"trainer.val_check_interval={PIXEL_STEPS}",
                                                       f"trainer.limit_val_batches={LRA_VAL_BATCHES}"])),
             () if quick else tuple(fashion), window=16 if quick else None, prior=True, length=64 if quick else 784),
        Task("lra_listops", f"ListOps <= {256 if quick else f'2000 tokens, {LISTOPS_TRAIN} expressions'} (test acc)",
             "test/acc", True,
             ("experiment=lra_listops", *(["data.max_length=256", "data.num_train=480", "data.num_val=64",
                                           "data.num_test=64", "trainer.max_epochs=1"]
                                          if quick else [f"data.num_train={LISTOPS_TRAIN}", "trainer.max_epochs=1",
                                                         f"trainer.limit_val_batches={LRA_VAL_BATCHES}"])),
             window=64 if quick else None, prior=True, length=256 if quick else 2000),
        Task("listops", f"ListOps <= {LISTOPS_LENGTH} tokens, learning recipe (test acc)", "test/acc", True,
             ("experiment=lra_listops", *replaced(LISTOPS_RECIPE, *(["data.num_train=2000", "trainer.max_steps=40",
                                                                     "data.num_test=200"] if quick else []))),
             window=LISTOPS_LENGTH // 4, prior=True, length=LISTOPS_LENGTH),
        *(Task(f"mqar_w{width}", f"MQAR {seq_len} tokens, {pairs} pairs, width {width} (query acc)", "test/acc", True,
               ("experiment=mqar", f"model.net.n_embd={width}", f"data.seq_len={seq_len}",
                f"data.num_kv_pairs={pairs}", *budget), window=seq_len // 4, length=seq_len)
          for seq_len, pairs, widths, budget in [MQAR_QUICK if quick else MQAR] for width in widths),
    ]  # fmt: skip


# Columns run and shown only when --tasks names them. lra_listops: LRA's ListOps length (up to 2000 tokens) at the
# budget a CPU job affords learned nothing in any of the 16 rows it ran (each answered the most common class; their
# records stay in the ledger), so it measures no difference between rows; the `listops` column replaces it.
OPT_IN = {"lra_listops": "up to 2000 tokens as in LRA: at this budget every row answered the most common class"}


def selected_columns(args: argparse.Namespace) -> list[Task]:
    """The columns of tasks(args) that --tasks names (besides `speed` and `cost`), or all but the OPT_IN ones."""
    columns = tasks(args)
    keys = [task.key for task in columns] + ["speed", "cost"]
    if not args.tasks:
        return [task for task in columns if task.key not in OPT_IN]
    unknown = sorted(set(args.tasks) - set(keys))
    if unknown:
        raise SystemExit(f"error: unknown tasks {unknown}; valid choices: {', '.join(keys)}")
    return [task for task in columns if task.key in args.tasks]


def missing_files(task: Task) -> list[str]:
    """The files `task` needs that are not there (a pattern of `needs` matches the plain or the .gz file)."""
    return [str(path) for path in task.needs if not any(path.parent.glob(path.name))]


def skipped(task: Task) -> dict | None:
    """The record of a job of `task` whose data is missing, or None."""
    missing = missing_files(task)
    return {"status": "skipped", "reason": f"{', '.join(missing)} not found"} if missing else None


DATA_OPTIONS = {"gpt_char": "--shared", "lra_pixel": "--fashion-mnist"}  # where each task's data is said to be


def skipped_columns(columns: list[Task]) -> list[str]:
    """One console line for each column whose data is missing: what is skipped, why, and how to include it."""
    return [f"skipping the {task.key} column: {', '.join(missing)} not found"
            + (f" (pass {DATA_OPTIONS[task.key]} <the folder that holds it>)" if task.key in DATA_OPTIONS else "")
            for task in columns if (missing := missing_files(task))]  # fmt: skip


# -- jobs and the ledger --------------------------------------------------------------------------------------
@dataclass
class Job:
    task: Task
    row: Row
    seed: int
    folder: Path

    @property
    def arguments(self) -> list[str]:
        local = self.task.window and self.row.attention.get("variant") == "local"
        window = [f"++attention.window={self.task.window}"] if local else []
        return [*self.task.overrides, *self.row.overrides, *window,
                f"seed={self.seed}", f"hydra.run.dir={self.folder}", "print_config=false",
                "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
                "+trainer.enable_progress_bar=false"]  # fmt: skip


def job_folder(runs_dir: Path, task: Task, row: Row, seed: int) -> Path:
    """runs_dir/<task>/<row>-seed<n>, with the characters an override value cannot hold unquoted (a row named after
    an option's value: full+kv_heads=1) written as '-'."""
    name = re.sub(r"[^\w.+-]", "-", row.name)
    return runs_dir / task.key / f"{name}-seed{seed}"


def ledger_file(ledger: Path | None, job: Job, kind: str = "") -> Path | None:
    """The ledger's record of a job, <ledger>/<task>/<row>-seed<n>[.<kind>].json (None: no ledger)."""
    if ledger is None:
        return None
    folder = job_folder(ledger, job.task, job.row, job.seed)
    return folder.with_name(f"{folder.name}{'.' + kind if kind else ''}.json")


def read_record(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def write_record(path: Path | None, record: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")


def mode_of(args: argparse.Namespace) -> str:
    """run (every job), resume (the jobs without a record, and the one-line errors again) or reuse (none)."""
    return "reuse" if args.reuse else "resume" if args.resume else "run"


def without_running(job: Job, path: Path | None, mode: str) -> dict | None:
    """A job's record where it runs nothing, else None: the ledger's (any with --reuse; with --resume any but a
    one-line error, redone: it ends in seconds, and the code may run that row now), the one-line reason its row stops
    short of the task's length (SPEED_LONGEST), "not run" with --reuse, or its missing data."""
    found = read_record(path) if mode != "run" else None
    if found is not None and (mode == "reuse" or found["status"] != "error"):
        return {**found, "reused": True}
    if reason := beyond_longest(job.row, job.task.length, "run"):
        return {"status": "error", "reason": reason}
    return dict(NOT_RUN) if mode == "reuse" else skipped(job.task)


@contextlib.contextmanager
def output_to(handle) -> Iterator[None]:
    """stdout, stderr and logging's console handlers (Lightning's, Hydra's) written to `handle`, and pointed back at
    the console afterwards (a handler left on a closed file fails at its next message)."""

    def handlers() -> list[logging.StreamHandler]:
        loggers = [logging.getLogger(), *map(logging.getLogger, list(logging.root.manager.loggerDict))]
        return [h for log in loggers for h in getattr(log, "handlers", []) if type(h) is logging.StreamHandler]

    def point(handler: logging.StreamHandler, stream) -> None:
        with contextlib.suppress(ValueError):  # its stream may be closed already
            handler.flush()
        handler.stream = stream

    console = {h: h.stream for h in handlers()}
    for handler in console:
        point(handler, handle)
    try:
        with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
            yield
    finally:
        for handler in (h for h in handlers() if h.stream is handle):
            previous = console.get(handler, sys.stderr)
            point(handler, sys.__stderr__ if getattr(previous, "closed", False) else previous)


def run_in_process(arguments: list[str], log: Path) -> int:
    """`python run.py <arguments>` run here (zoo.app.run), its output in `log`; returns the exit status."""
    code = 0
    with open(log, "w") as handle, output_to(handle):
        try:
            zoo.app.run(arguments)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except Exception:  # a bug: its traceback goes to the log, the study goes on
            traceback.print_exc()
            code = 1
    if code in STOPPED_BY_SIGNAL:  # the job saved its checkpoint and stopped for the user: so does the study
        raise SystemExit(f"error: the study was stopped ({STOPPED_BY_SIGNAL[code]}) in the job logged to {log}; "
                         "python experiments/variant_study.py --resume continues it")  # fmt: skip
    return code


def run_in_folder(folder: Path, arguments: list[str], label: str) -> tuple[int, Path]:
    """run_in_process with its log in a fresh `folder` (one already there is kept aside, not deleted), announced on
    the console as `label`."""
    print(f"{label} ...", end=" ", flush=True)
    if folder.exists():
        folder.rename(folder.with_name(f"{folder.name}.old-{datetime.now():%Y%m%d-%H%M%S}"))
    folder.mkdir(parents=True)
    return run_in_process(arguments, folder / "study.log"), folder / "study.log"


def unfinished(code: int, log: Path) -> dict:
    """The record of a job that ended without a number: exit 2 is bad input, whose one line the log ends with."""
    if code != 2:
        return {"status": "failed", "reason": f"failed (exit {code}): see {log}"}
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error: ")]
    return {"status": "error", "reason": lines[-1][len("error: ") :] if lines else "exit 2 without a message"}


def now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M")


def kept(path: Path | None, result: dict) -> dict:
    """`result`, written to the ledger where it ends with a number or a one-line error (a failure is run again)."""
    if result["status"] in ("ok", "error"):
        write_record(path, result)
    return result


def run_job(job: Job, ledger: Path | None = None, mode: str = "run", machine_name: str = "") -> dict:
    """One job's record: the ledger's where `mode` takes it (recorded), else the job run now ("not run" with
    --reuse). One that ends with a number or a one-line error goes to the ledger; a failure does not."""
    path = ledger_file(ledger, job)
    if (settled := without_running(job, path, mode)) is not None:
        return settled
    start = time.perf_counter()
    code, log = run_in_folder(job.folder, job.arguments, f"{job.task.key} / {job.row.name} / seed {job.seed}")
    wall = time.perf_counter() - start
    metrics_file = job.folder / "metrics.json"
    if code == 0 and metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        value = metrics.get(job.task.metric)
        result = {"status": "ok", "value": value, "metrics": metrics} if value is not None else \
            {"status": "failed", "reason": f"no {job.task.metric} in {metrics_file}"}  # fmt: skip
    else:
        result = unfinished(code, log)
    result.update(wall_s=round(wall, 1), date=now(), seed=job.seed, machine=machine_name,
                  command="python run.py " + " ".join(job.arguments))  # fmt: skip
    outcome = fmt(result.get("value"), job.task.digits) if result["status"] == "ok" else result["reason"]
    print(f"{result['status']} {outcome} ({wall:.0f} s)", flush=True)
    return kept(path, result)


def run_as(job: Job, plain: Job, args: argparse.Namespace, done: dict[Path, dict]) -> dict:
    """The record of a row that trains as `plain`'s row by definition (PLAIN_WITHIN_BLOCK): the ledger's where
    --reuse or --resume takes it; else a one-batch run of the row (its one-line error if it cannot run the task),
    then `plain`'s record (`done` in this study, else run or taken now), kept as the row's own."""
    path, mode = ledger_file(args.ledger, job), mode_of(args)
    if (settled := without_running(job, path, mode)) is not None:
        return settled
    check = Job(job.task, job.row, job.seed, job.folder / "one_batch")
    label = f"{job.task.key} / {job.row.name} / seed {job.seed}: one batch"
    code, log = run_in_folder(job.folder, [*check.arguments, "trainer.fast_dev_run=true"], label)
    if code != 0:
        result = {**unfinished(code, log), "seed": job.seed, "command": "python run.py " + " ".join(check.arguments)}
        print(f"{result['status']} {result['reason']}", flush=True)
    else:
        print(f"ok; trains as {plain.folder.name}", flush=True)
        if plain.folder not in done:
            done[plain.folder] = run_job(plain, args.ledger, mode, args.machine_name)
        result = {**{k: v for k, v in done[plain.folder].items() if k != "reused"}, "trained_as": plain.folder.name}
    return kept(path, result)


def plain_row(rows: list[Row]) -> Row:
    """The PLAIN_ROPE row (found again when --rows leaves it out)."""
    return next((row for row in rows if row.name == PLAIN_ROPE), None) or next(
        row for row in discover_rows()[0] if row.name == PLAIN_ROPE
    )


# -- the GPT at 4x its block ----------------------------------------------------------------------------------
def compose(overrides: list[str], folder: Path):
    """The config `python run.py <overrides>` would see, with outputs in `folder`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    zoo.app.setup()  # the resolvers conf/ uses
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.root_dir, cfg.paths.output_dir, cfg.paths.log_dir = str(ROOT), str(folder), str(folder)
    return cfg


def extrapolation(job: Job, quick: bool, factor: int = 4) -> dict:
    """Val loss of a trained GPT at `factor` x its block. Attention that extrapolates (a position bias, scaled
    RoPE) takes the longer input as trained (dynamic NTK scales from the trained block); otherwise the same
    weights in a GPT with a longer block (a learned position table, or any weight shaped by the block, has no
    rows for it: the one-line reason instead). Linear and NTK-aware RoPE scaling are what their users apply to a
    model trained with plain RoPE, at inference: their rows take the rope row's weights of the same seed, scaled
    by `factor` (the rows themselves trained with the scaling on: positions compressed from the first step)."""
    import hydra
    import torch
    import torch.nn.functional as F

    from zoo.data.tokenizers import tokenizer_to_string
    from zoo.models.gpt import GPT, GPTConfig
    from zoo.weights import network_state_dict, read_checkpoint

    scaling = job.row.attention.get("rope_scaling")
    weights = job.folder.with_name(f"{PLAIN_ROPE}-seed{job.seed}") if scaling in SCALED_AT_INFERENCE else job.folder
    if not (weights / "checkpoints" / "last.ckpt").is_file():
        return {"status": "failed", "reason": f"no {weights / 'checkpoints' / 'last.ckpt'}"
                + (f" ({scaling} RoPE scaling stretches the {PLAIN_ROPE} row's weights: run it first)"
                   if weights != job.folder else "")}  # fmt: skip
    checkpoint = read_checkpoint(weights / "checkpoints" / "last.ckpt")
    net = dict(checkpoint["hyper_parameters"]["net"])
    block = net["block_size"]
    if weights != job.folder:
        if not net["attention"].get("rope") or net["attention"].get("rope_scaling") is not None:
            return {"status": "failed", "reason": f"{weights} is not a plain RoPE run: {net['attention']}"}
        net["attention"] = {**net["attention"], "rope_scaling": scaling, "rope_factor": float(factor)}
    try:
        trained = GPTConfig.from_dict(net)
        model = GPT(
            trained if trained.attention.extrapolates else GPTConfig.from_dict({**net, "block_size": factor * block})
        )
    except ValueError as error:
        return {"status": "error", "reason": " ".join(str(error).split())}
    state, own = network_state_dict(checkpoint["state_dict"]), model.state_dict()
    for key, value in state.items():
        if key in own and own[key].shape != value.shape:
            return {"status": "error", "reason": f"{key} is {tuple(value.shape)} for block {block}, "
                    f"{tuple(own[key].shape)} at block {factor * block}: no weights for the longer input"}  # fmt: skip
    model.load_state_dict(state)
    model.eval()
    overrides = [*job.task.overrides, *job.row.overrides, f"data.block_size={factor * block}",
                 f"data.eval_batches={8 if quick else 'null'}", "data.eval_batch_size=16"]  # fmt: skip
    data = hydra.utils.instantiate(compose(overrides, job.folder / "extrapolation").data, _convert_="all")
    data.setup("validate")
    if tokenizer_to_string(data.tokenizer) != checkpoint["tokenizer"]:
        return {"status": "failed", "reason": "the data's tokenizer differs from the checkpoint's"}
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.val_dataloader():
            total += float(F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
    return {"status": "ok", "value": total / count, "block": factor * block, "model_block": model.config.block_size,
            "weights": weights.name}  # fmt: skip


def longer_block(job: Job, result: dict, args: argparse.Namespace) -> dict:
    """The 4x evaluation of a finished GPT job, kept in the ledger with its number or its one-line error (a weight
    shaped by the block is a fact of the row: a later --reuse may find the job's record but not its checkpoint)."""
    if result["status"] != "ok":
        return {"status": result["status"], "reason": result.get("reason")}
    path = ledger_file(args.ledger, job, "extrapolation")
    if (found := read_record(path) if args.reuse or args.resume else None) is not None:
        return found
    if args.reuse:
        return dict(NOT_RUN)
    start = time.perf_counter()
    try:
        outcome = extrapolation(job, args.quick)
    except Exception as error:  # a bug in this evaluation must not end the study
        outcome = {"status": "failed", "reason": f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"}
    outcome["wall_s"] = round(time.perf_counter() - start, 1)
    return kept(path, outcome)


# -- the class prior ------------------------------------------------------------------------------------------
def most_common_share(task: Task, folder: Path) -> dict:
    """The share of `task`'s test set that its most common class holds: the accuracy of a classifier that learned
    nothing but the class prior (a row at this value answers that class to every input)."""
    import hydra

    if missing := skipped(task):
        return missing
    data = hydra.utils.instantiate(compose(list(task.overrides), folder).data, _convert_="all")
    data.setup("test")
    labels = data.splits["test"].tensors[1]
    counts = labels.bincount()
    top = int(counts.argmax())
    classes = getattr(data, "classes", None)
    return {"status": "ok", "value": float(counts[top]) / len(labels), "class": str(classes[top] if classes else top),
            "test_size": len(labels)}  # fmt: skip


def priors(columns: list[Task], folder: Path) -> dict[str, dict]:
    """most_common_share of every column that shows one (Task.prior), by task key."""
    return {task.key: most_common_share(task, folder / task.key) for task in columns if task.prior}


# -- training time per step -----------------------------------------------------------------------------------
def step_times(rows: list[Row], quick: bool, shapes: dict[int, tuple[int, int | None]] | None = None) -> dict:
    """ms per training step (forward, backward, AdamW) of the long-range tasks' classifier (2 layers, width 64) at
    each length n of `shapes` (n -> (vocabulary, padding id)): n=784 as the pixel task (256 pixel values, never
    padded), n=2000 as ListOps (16 symbols, each sequence padded after a random length of n/4 to n tokens).
    Rows are interleaved in every round; median over rounds."""
    import torch
    import torch.nn.functional as F

    from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig

    shapes = shapes or SPEED_SHAPES
    batch, steps, rounds = (4, 2, 1) if quick else (32, 3, 3)
    generator = torch.Generator().manual_seed(0)
    inputs = {}
    for n, (vocabulary, padding_id) in shapes.items():
        low = 0 if padding_id is None else padding_id + 1
        tokens = torch.randint(low, vocabulary, (batch, n), generator=generator)
        if padding_id is not None:
            lengths = torch.randint(n // 4, n + 1, (batch, 1), generator=generator)
            tokens[torch.arange(n)[None, :] >= lengths] = padding_id
        inputs[n] = (tokens, torch.randint(0, 10, (batch,), generator=generator))
    models, results = {}, {row.name: {} for row in rows}
    for row in rows:
        for n, (vocabulary, padding_id) in shapes.items():
            if reason := beyond_longest(row, n, "timed"):
                results[row.name][n] = {"status": "error", "reason": reason}
                continue
            try:
                config = SequenceClassifierConfig(
                    vocab_size=vocabulary, max_length=n, padding_id=padding_id, dim=64, depth=2, num_heads=4,
                    mlp_dim=128, dropout=0.1, attention=dict(row.attention),
                )  # fmt: skip
                model = SequenceClassifier(config).train()
                models[row.name, n] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            except ValueError as error:
                results[row.name][n] = {"status": "error", "reason": " ".join(str(error).split())}
    timings: dict = {key: [] for key in models}

    def step(model, optimizer, tokens, labels) -> None:
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for round_ in range(rounds):
        for (name, n), (model, optimizer) in models.items():
            if n in results[name]:
                continue  # it failed
            tokens, labels = inputs[n]
            try:
                if round_ == 0:
                    step(model, optimizer, tokens, labels)  # warm-up
                start = time.perf_counter()
                for _ in range(steps):
                    step(model, optimizer, tokens, labels)
                timings[name, n].append(1000 * (time.perf_counter() - start) / steps)
            except (ValueError, RuntimeError) as error:
                results[name][n] = {"status": "error", "reason": " ".join(str(error).split())[:300]}
    from experiments.attention_benchmark import peak_bytes

    for (name, n), values in timings.items():
        if values and n not in results[name]:
            model, optimizer = models[name, n]
            # the high-water mark of tensor bytes over one step (every allocation and free, as the attention
            # benchmark measures it): activations, gradients and the optimiser's update
            peak = peak_bytes(lambda fn, x, m=model, o=optimizer: step(m, o, *x), None, inputs[n], torch.device("cpu"))
            results[name][n] = {"status": "ok", "value": statistics.median(values), "rounds": values,
                                "peak_mib": peak / 2**20}  # fmt: skip
    return {"batch": batch, "steps": steps, "rounds": rounds, "threads": torch.get_num_threads(),
            "lengths": list(shapes), "rows": results}  # fmt: skip


EMPTY_SPEED = {"batch": 0, "steps": 0, "rounds": 0, "threads": 0, "lengths": [], "rows": {}}


def int_keys(speed: dict) -> dict:
    """A speed record read back from JSON: its lengths as ints again."""
    rows = {name: {int(n): result for n, result in by_n.items()} for name, by_n in speed.get("rows", {}).items()}
    return {**speed, "lengths": [int(n) for n in speed.get("lengths", [])], "rows": rows}


def speed_of(args: argparse.Namespace, rows: list[Row]) -> dict:
    """step_times of `rows`, each stamped with its date and machine, merged into the ledger's speed.json (--reuse:
    the ledger's alone)."""
    path = args.ledger and args.ledger / "speed.json"
    speed = old = int_keys(found) if (found := read_record(path)) else None
    if not args.reuse:
        speed = step_times(rows, args.quick)
        for result in (r for by_n in speed["rows"].values() for r in by_n.values()):
            result.update(date=now(), machine=args.machine_name)
        if old:
            speed.update(lengths=sorted({*old["lengths"], *speed["lengths"]}), rows={**old["rows"], **speed["rows"]})
        write_record(path, speed)
    speed = speed or EMPTY_SPEED
    return {**speed, "rows": {row.name: speed["rows"][row.name] for row in rows if row.name in speed["rows"]}}


def prior_of(args: argparse.Namespace, columns: list[Task]) -> dict:
    """priors() of the columns, merged into the ledger's prior.json (--reuse: the ledger's alone)."""
    path = args.ledger and args.ledger / "prior.json"
    found = read_record(path) or {}
    if not args.reuse:
        found.update(priors(columns, args.runs_dir / ("quick" if args.quick else "full") / "prior"))
        write_record(path, found)
    return {task.key: found[task.key] for task in columns if task.prior and task.key in found}


def cost_arguments(job: Job, out: Path) -> list[str]:
    """The job's command cut to COST_STEPS training steps, without validation or test, with StepCost writing to
    `out`; as many epochs as those steps take (a small training set, as --quick's numbers task, has fewer batches)."""
    return list(replaced(tuple(job.arguments), f"trainer.max_steps={COST_STEPS}", "trainer.max_epochs=-1",
                         "trainer.limit_val_batches=0", "test=false",
                         "+callbacks.step_cost._target_=experiments.step_cost.StepCost",
                         f"+callbacks.step_cost.path={out}"))  # fmt: skip


def probe_cost(task: Task, row: Row, args: argparse.Namespace) -> dict:
    """The step time and peak memory of `row` on `task` (cost_arguments), or the one-line reason it has none."""
    import torch

    if missing := skipped(task):
        return missing
    if reason := beyond_longest(row, task.length, "measured"):
        return {"status": "error", "reason": reason}
    seed0 = job_folder(args.runs_dir / ("quick" if args.quick else "full"), task, row, 0)
    job = Job(task, row, 0, seed0.with_name(seed0.name.replace("-seed0", "-cost")))
    code, log = run_in_folder(job.folder, cost_arguments(job, out := job.folder / "step_cost.json"),
                              f"{task.key} / {row.name} / cost")  # fmt: skip
    if code == 0 and out.is_file():
        result = {"status": "ok", **json.loads(out.read_text())}
        shown = f"{fmt(result['step_ms'], 0)} ms/step, {fmt(result['peak_mib'], 1)} MiB"
    else:
        result = unfinished(code, log)
        shown = result["reason"]
    print(f"{result['status']} {shown}", flush=True)
    return {**result, "date": now(), "machine": args.machine_name, "threads": torch.get_num_threads()}


def cost_columns(args: argparse.Namespace, columns: list[Task]) -> list[Task]:
    """The columns the cost pass measures: those shown, or with `--tasks cost` alone every default column."""
    if columns or not args.tasks:
        return columns
    return [task for task in tasks(args) if task.key not in OPT_IN]


def cost_of(args: argparse.Namespace, rows: list[Row], columns: list[Task]) -> dict:
    """{task: {row: cost record}} of the shown rows and columns, kept in the ledger's cost.json: measured (probe_cost)
    when --tasks names `cost` or no column at all; --resume measures the pairs without a record or with a one-line
    error; --reuse reads the ledger only."""
    path = args.ledger and args.ledger / COST
    found: dict = read_record(path) or {}
    measure = not args.reuse and (not args.tasks or "cost" in args.tasks)
    for task in cost_columns(args, columns) if measure else []:
        for row in rows:
            if args.resume and found.get(task.key, {}).get(row.name, {}).get("status", "error") != "error":
                continue
            result = probe_cost(task, row, args)
            if result["status"] in ("ok", "error"):
                found.setdefault(task.key, {})[row.name] = result
                write_record(path, found)
    return {task.key: {row.name: found[task.key][row.name] for row in rows if row.name in found.get(task.key, {})}
            for task in columns}  # fmt: skip


# -- the study ------------------------------------------------------------------------------------------------
def summarise(results: list[dict]) -> dict:
    """Median and 95% bootstrap interval of a cell's seeds (study_stats.Cell), the seeds it needs (its first job's
    time decides: study_stats.seeds_required), or the reason it has no number."""
    values = [r["value"] for r in results if r["status"] == "ok" and r.get("value") is not None]
    walls = [r["wall_s"] for r in results if r.get("wall_s") is not None]
    reasons = sorted({r["reason"] for r in results if r["status"] != "ok" and r.get("reason")})
    cell = Cell.of(values) if values else Cell(None)
    return {
        "median": cell.median, "low": cell.low, "high": cell.high, "values": values,
        "required": seeds_required(results[0].get("wall_s") if results else None),
        "wall_s": statistics.median(walls) if walls else None,
        "cpu_s": sum(r["wall_s"] for r in results if r.get("wall_s") is not None and not r.get("trained_as")),
        "reason": reasons[0] if reasons else None,
    }  # fmt: skip


def run_study(args: argparse.Namespace, rows: list[Row], columns: list[Task]) -> dict:
    """{row: {column: cell}}: each cell's seeds run (or taken from the ledger) up to the count its first job's time
    sets (--seeds caps it); a job that cannot run, or has no record, gets no further seed."""
    runs_dir = args.runs_dir / ("quick" if args.quick else "full")
    cells: dict[str, dict[str, dict]] = {row.name: {} for row in rows}
    done: dict[Path, dict] = {}  # job folder -> record, for the rows that train as another (run_as)
    for task in columns:
        for row in rows:
            results: list[dict] = []
            while len(results) < (args.seeds or summarise(results)["required"] if results else 1):
                seed = len(results)
                job = Job(task, row, seed, job_folder(runs_dir, task, row, seed))
                if row.attention.get("rope_scaling") in PLAIN_WITHIN_BLOCK:
                    plain = plain_row(rows)
                    result = run_as(job, Job(task, plain, seed, job_folder(runs_dir, task, plain, seed)), args, done)
                else:
                    result = done[job.folder] = run_job(job, args.ledger, mode_of(args), args.machine_name)
                if result["status"] == "not run" and results:
                    break  # --reuse: the seeds recorded so far
                results.append(result)
                if task.key == "gpt_char":
                    cells[row.name].setdefault(EXTRAPOLATION, {"runs": []})["runs"].append(
                        longer_block(job, result, args)
                    )
                if result["status"] != "ok":
                    break
            cells[row.name][task.key] = {"runs": results}
    for row_cells in cells.values():
        for cell in row_cells.values():
            cell.update(summarise(cell["runs"]))
        if EXTRAPOLATION in row_cells:  # an evaluation of the GPT's weights: the seeds the GPT cell needs
            row_cells[EXTRAPOLATION]["required"] = row_cells["gpt_char"]["required"]
    return cells


# -- the page: its tables and figure, in the words of variant_study_page.md -----------------------------------
PAGE = Path(__file__).with_name("variant_study_page.md")


@functools.cache
def blocks() -> dict[str, str]:
    """The page's words by block name (a block runs from its `<!-- name -->` line to the next)."""
    parts = re.split(r"^<!-- (\w+) -->\n", PAGE.read_text(), flags=re.M)
    return {name: text.strip("\n") for name, text in zip(parts[1::2], parts[2::2])}


def say(block: str, **values: object) -> str:
    """A block of the page's words with its {placeholders} filled."""
    return blocks()[block].format_map(values)


class Footnotes(list):
    """The reasons a table shows in place of numbers: each once, marked [n] in every cell it applies to."""

    def mark(self, note: str) -> str:
        if note not in self:
            self.append(note)
        return f"[{self.index(note) + 1}]"

    def markdown(self) -> str:
        return "\n\n" + "\n".join(f"[{i}] {note}" for i, note in enumerate(self, 1)) if self else ""


def cell_text(cell: dict | None, digits: int, notes: Footnotes, mark: str = "") -> str:
    """median [95% interval] n=<seeds>/<seeds needed>, then the verdict's mark: **bold** for a clear winner,
    "≈ best" for the best and the rows tied with it where there is none."""
    if not cell or (cell["median"] is None and cell.get("reason") == NOT_RUN["reason"]):
        return "not run"
    if cell["median"] is None:
        return notes.mark(cell["reason"] or "no value")
    shown = fmt(cell["median"], digits)
    if cell.get("low") is not None:
        shown += f" [{fmt(cell['low'], digits)}, {fmt(cell['high'], digits)}]"
    if cell.get("required"):
        shown += f" n={len(cell['values'])}/{cell['required']}"
    return f"**{shown}** winner" if mark == "winner" else f"{shown} ≈ best" if mark in ("best", "≈ best") else shown


def timing_text(result: dict | None, row: str, notes: Footnotes, key: str, peak_digits: int, absent: str) -> str:
    """A step timing: `key`'s ms (peak MiB), footnoted when its kernel got faster since (KERNEL_CHANGES); else the
    reason it has none, or `absent` without a record."""
    if result is None:
        return absent
    if result["status"] != "ok":
        return notes.mark(result["reason"])
    peak = "not measured" if result.get("peak_mib") is None else fmt(result["peak_mib"], peak_digits)
    changed, page = KERNEL_CHANGES.get(row, (None, None))
    late = changed is not None and result.get("date", changed) < changed
    mark = " " + notes.mark(say("kernel_changed", row=row, changed=changed, page=page)) if late else ""
    return f"{fmt(result[key], 0)} ({peak}){mark}"


def cost_section(rows: list[Row], columns: list[Task], cost: dict) -> str:
    """The step time and peak memory of every row on every column (cost_of), with the footnoted reasons."""
    from experiments.step_cost import WARMUP  # here: the study's other pages load without torch and Lightning

    notes = Footnotes()
    body = [[row.name, *(timing_text(cost.get(task.key, {}).get(row.name), row.name, notes, "step_ms", 1,
                                     "not measured") for task in columns)] for row in rows]  # fmt: skip
    done = [r for by_row in cost.values() for r in by_row.values() if r["status"] == "ok"]
    measured = " " + say("cost_measured", first=min(r["date"] for r in done), last=max(r["date"] for r in done),
                         machines="; ".join(sorted({r["machine"] for r in done})),
                         threads=", ".join(sorted({str(r["threads"]) for r in done}))) if done else ""  # fmt: skip
    return say("cost", steps=COST_STEPS, warmup=WARMUP, measured=measured,
               table=table(["attention", *(task.title for task in columns)], body) + notes.markdown())  # fmt: skip


def columns_of(columns: list[Task]) -> list[tuple[str, str, int, bool]]:
    """(key, header, digits, higher is better) of every quality column, the 4x extrapolation after the GPT's."""
    return [
        column
        for task in columns
        for column in [(task.key, task.title, task.digits, task.higher_is_better)]
        + ([(EXTRAPOLATION, "GPT val loss at 4x the block", 4, False)] if task.key == "gpt_char" else [])
    ]


def column_cells(cells: dict, key: str) -> dict[str, Cell]:
    """The rows with a number in column `key`, as study_stats.Cell (median, interval, seeds)."""
    return {name: Cell(row[key]["median"], row[key].get("low"), row[key].get("high"), len(row[key]["values"]))
            for name, row in cells.items() if row.get(key, {}).get("median") is not None}  # fmt: skip


def at_prior(column: dict[str, Cell], share: dict, digits: int) -> bool:
    """Whether no row of the column scores above the class prior's share (as shown): nothing learned but the prior."""
    top = max((cell.median for cell in column.values()), default=None)
    if share.get("status") != "ok" or top is None:
        return False
    return float(fmt(top, digits)) <= float(fmt(share["value"], digits))


def marks(cells: dict, quality: list[tuple[str, str, int, bool]], prior: dict) -> dict[str, dict[str, str]]:
    """column key -> row -> the verdict's mark (study_stats.verdict); none in a column at the class prior."""
    return {key: {} if at_prior(column := column_cells(cells, key), prior.get(key, {}), digits)
            else verdict(column, higher)["marks"] for key, _, digits, higher in quality}  # fmt: skip


def winners(cells: dict, quality: list[tuple[str, str, int, bool]], speed: dict, prior: dict | None = None) -> list:
    """Each column's verdict line: its winner, or "no clear winner" and the rows tied with the best; "no row" where
    none beats the class prior. The step timings by the same rule, over their timing rounds."""
    lines = []
    for key, header, digits, higher in quality:
        share = (prior or {}).get(key, {})
        if not (column := column_cells(cells, key)):
            continue
        if at_prior(column, share, digits):
            lines.append(say("no_row", header=header, share=fmt(share["value"], digits), label=share["class"],
                             rows=len(column)))  # fmt: skip
        else:
            lines.append(verdict_line(header, column, verdict(column, higher), lambda x, d=digits: fmt(x, d), "seed",
                                      "rows with a number"))  # fmt: skip
    for n in speed["lengths"]:
        column = {name: Cell.of(r[n].get("rounds") or [r[n]["value"]])
                  for name, r in speed["rows"].items() if r.get(n, {}).get("status") == "ok"}  # fmt: skip
        if column:
            lines.append(verdict_line(f"training step at n={n}", column, verdict(column, False), lambda x: f"{x:.0f}",
                                      "timing round", "rows timed", unit=" ms"))  # fmt: skip
    return lines


def verdict_line(header: str, column: dict[str, Cell], result: dict, shown: Callable[[float], str], sample: str,
                 counted: str, unit: str = "") -> str:  # fmt: skip
    """A column's line of "Which setting wins where": `shown` writes a value, `sample` names what the interval is
    over (seed, timing round), `counted` the rows it compared."""
    top = column[result["best"]]
    interval = f" [{shown(top.low)}, {shown(top.high)}]" if top.low is not None else ""
    value = f"{shown(top.median)}{unit}{interval}, {top.n} {sample}(s)"
    if result["winner"]:
        return say("winner", header=header, winner=result["winner"], value=value, rows=len(column), counted=counted)
    tied = [name for name, mark in result["marks"].items() if mark == "≈ best" and name != result["best"]]
    reason = f"too few {sample}s for an interval" if top.low is None or top.n < 3 else "rows inside its interval"
    return say("no_winner", header=header, best=result["best"], value=value, reason=reason,
               tied=", ".join(tied) or "none", rows=len(column), counted=counted)  # fmt: skip


def zoology_anchor(cells: dict, quality: list[tuple[str, str, int, bool]]) -> list[str]:
    """Per MQAR column: whether full attention is ahead of linear attention as in Zoology (full's interval above
    linear's), and which rows reach full's level (their interval overlaps full's) or stay below."""
    lines = []
    attention, substitute = ZOOLOGY["attention"], ZOOLOGY["substitute"]
    for key, header, digits, _ in (q for q in quality if q[0].startswith("mqar")):
        column = column_cells(cells, key)
        if attention not in column or substitute not in column:
            lines.append(say("zoology_unmeasured", header=header, attention=attention, substitute=substitute))
            continue
        top, other = column[attention], column[substitute]
        seeds = {"full_seeds": top.n, "linear_seeds": other.n}
        said = ("zoology_too_few" if top.n < 3 or other.n < 3 else "zoology_reproduced"
                if top.span()[0] > other.span()[1] else "zoology_not_shown" if top.median > other.median
                else "zoology_not_reproduced")  # fmt: skip
        low, high = top.span()
        others = sorted((n for n in column if n != attention), key=lambda n: -column[n].median)
        level = [n for n in others if column[n].span()[1] >= low and column[n].span()[0] <= high]
        below = [f"{n} {fmt(column[n].median, digits)}" for n in others if n not in level]
        lines.append(say("zoology_line", header=header, full=fmt(top.median, digits),
                         linear=fmt(other.median, digits), **seeds, said=say(said, **seeds),
                         level=", ".join(level) or "none", below=", ".join(below) or "none"))  # fmt: skip
    return lines


def plot_times(cells: dict, key: str, cost: dict | None) -> tuple[str, dict[str, float]]:
    """(x-axis label, {row: x}) of column `key`'s panel: the cost pass's step time where every row with a number has
    one (one pass, one host: the rows compare), else the jobs' median wall seconds; the 4x column at the GPT's."""
    timed = "gpt_char" if key == EXTRAPOLATION else key
    shown = [name for name, row in cells.items() if row.get(key, {}).get("median") is not None]
    steps = {name: (cost or {}).get(timed, {}).get(name, {}) for name in shown}
    if shown and all(step.get("status") == "ok" for step in steps.values()):
        return "ms per training step, cost pass (log)", {name: step["step_ms"] for name, step in steps.items()}
    walls = {name: cells[name].get(timed, {}).get("wall_s") for name in shown}
    return "wall seconds per job (log)", {name: wall for name, wall in walls.items() if wall}


def plot(cells: dict, quality: list[tuple[str, str, int, bool]], path: Path, prior: dict | None = None,
         cost: dict | None = None) -> None:  # fmt: skip
    """One panel per quality column: each row's median and interval against its training time (plot_times, log). A
    class prior is a dashed line; the rows on it are grey and counted rather than named."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    if not quality:
        return  # the speed table alone (--tasks speed): nothing to draw
    columns = min(4, len(quality))
    rows = math.ceil(len(quality) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(quality) :]:
        ax.axis("off")
    for ax, (key, header, digits, higher) in zip(axes.flat, quality):
        label, times = plot_times(cells, key, cost)
        points = [(x, cells[name][key]["median"], name) for name, x in times.items()]
        share = (prior or {}).get(key, {})
        at = fmt(share["value"], digits) if share.get("status") == "ok" else None
        for x, value, name in points:
            color = "tab:grey" if at is not None and fmt(value, digits) == at else "tab:blue"
            cell = cells[name][key]
            if cell.get("low") is not None:  # the 95% interval over seeds
                ax.errorbar(x, value, yerr=[[value - cell["low"]], [cell["high"] - value]], fmt="none", ecolor=color,
                            elinewidth=0.8, capsize=2)  # fmt: skip
            ax.scatter(x, value, color=color)
            if color == "tab:blue":
                ax.annotate(name, (x, value), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if at is not None:
            ax.axhline(share["value"], color="tab:grey", linestyle="--", linewidth=0.8)
            count = sum(fmt(value, digits) == at for _, value, _ in points)
            ax.annotate(f"class prior {at}" + (f": {count} row(s) on it" if count else ""), (0.02, share["value"]),
                        xycoords=("axes fraction", "data"), xytext=(0, 4), textcoords="offset points", fontsize=7,
                        color="tab:grey")  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(header, fontsize=8)
        ax.set_xlabel(label, fontsize=7)
        ax.set_ylabel(("higher" if higher else "lower") + " is better", fontsize=7)
        ax.tick_params(labelsize=7)
        if not points:
            ax.text(0.5, 0.5, "no numbers", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("quality vs time per attention setting (median over seeds, bars: 95% bootstrap interval)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def provenance(cells: dict) -> str:
    """Which jobs this run measured and which it took from earlier records (--reuse): when, and on which machines."""
    runs = [run for row in cells.values() for cell in row.values() for run in cell.get("runs", [])
            if run.get("status") == "ok" and "command" in run]  # fmt: skip
    earlier = [run for run in runs if run.get("reused")]
    if not earlier:
        return say("provenance_all_new")
    dates = sorted(run["date"] for run in earlier if run.get("date")) or ["date not recorded"]
    machines = sorted({run.get("machine") or "machine not recorded" for run in earlier})
    mixed = len({"bf16 native" in machine for machine in machines}) > 1  # the GPT's precision differs between them
    return say("provenance", new=len(runs) - len(earlier), runs=len(runs), earlier=len(earlier), first=dates[0],
               last=dates[-1], machines="; ".join(machines), ledger=LEDGER) + (
        " " + say("provenance_mixed") if mixed else "")  # fmt: skip


def remaining_work(rows: list[Row], cells: dict, cost: dict) -> dict:
    """What the page lacks: {"cells", "jobs", "hours", "unknown"}. A cell lacks jobs when it has fewer seeds than it
    needs (none recorded: "not run"); a row that cannot run a task, the 4x column and a row trained as another lack
    none. A job's time: the cell's own median job, else full attention's on that column scaled by the cost pass's
    step times; "unknown" counts the jobs with neither."""
    cells_lacking, jobs, seconds, unknown = 0, 0, 0.0, 0
    for row in (r for r in rows if r.attention.get("rope_scaling") not in PLAIN_WITHIN_BLOCK):
        for key, cell in cells[row.name].items():
            missing = cell["required"] - len(cell["values"])
            cannot = cell["median"] is None and cell.get("reason") != NOT_RUN["reason"]
            if key == EXTRAPOLATION or cannot or missing <= 0:
                continue
            cells_lacking, jobs = cells_lacking + 1, jobs + missing
            step, base = (cost.get(key, {}).get(name, {}) for name in (row.name, "full"))
            full_wall = cells.get("full", {}).get(key, {}).get("wall_s")
            if cell.get("wall_s"):
                seconds += missing * cell["wall_s"]
            elif step.get("status") == base.get("status") == "ok" and full_wall:
                seconds += missing * full_wall * step["step_ms"] / base["step_ms"]
            else:
                unknown += missing
    return {"cells": cells_lacking, "jobs": jobs, "hours": round(seconds / 3600, 1), "unknown": unknown}


def left_to_run(left: dict) -> str:
    """The page's sentence on what remains (remaining_work), or nothing when every cell is complete."""
    if not left["jobs"]:
        return ""
    unknown = say("left_unknown", unknown=left["unknown"]) if left["unknown"] else ""
    return " " + say("left_to_run", **{**left, "unknown": unknown})


def prior_text(prior: dict, columns: list[Task]) -> str:
    """The class-prior line under the table (most_common_share of each column that shows one)."""
    titles = {task.key: task.title for task in columns}
    shares = [f"{titles.get(key, key)}: {fmt(share['value'], 3)} (class {share['class']}, of {share['test_size']})"
              if share["status"] == "ok" else f"{titles.get(key, key)}: not measured ({share['reason']})"
              for key, share in prior.items()]  # fmt: skip
    return say("prior", shares="; ".join(shares)) if shares else ""


def markdown(args, info, rows, notes_rows, columns, cells, speed, wall_min, prior=None, cost=None) -> str:
    """The page: variant_study_page.md's `page` block with this run's tables, verdicts and numbers."""
    prior, cost, notes = prior or {}, cost or {}, Footnotes()
    quality = columns_of(columns)
    trained = [(key, title) for key, title, _, _ in quality if key != EXTRAPOLATION]  # the columns of jobs
    verdicts = marks(cells, quality, prior)
    lra = {row: f"{model}: {s['Image']:.2f} / {s['ListOps']:.2f}" for model, s in LRA_TABLE_1.items()
           for row in s["rows"]}  # fmt: skip
    body = [[row.name, *(cell_text(cells[row.name].get(key), digits, notes, verdicts[key].get(row.name, ""))
                         for key, _, digits, _ in quality),
             *(timing_text(speed["rows"].get(row.name, {}).get(n), row.name, notes, "value", 0, "not run")
               for n in speed["lengths"]), lra.get(row.name, "-")] for row in rows]  # fmt: skip
    # a job's time where it trained to a number ("-" where it failed to start)
    walls = [[row.name, *(fmt(cell.get("wall_s") if cell.get("median") is not None else None, 0)
                          for key, _ in trained for cell in [cells[row.name].get(key, {})])]
             for row in rows]  # fmt: skip
    short = sum(1 for row in rows for key, *_ in quality if (cell := cells[row.name].get(key)) and cell["values"]
                and len(cell["values"]) < cell.get("required", 1))  # fmt: skip
    cpu_hours = sum(cell.get("cpu_s") or 0 for row in cells.values() for cell in row.values()) / 3600
    shown = {task.key for task in columns}
    zoology = zoology_anchor(cells, quality)
    listops = (say("budget_lra_listops", expressions=LISTOPS_TRAIN) if "lra_listops" in shown
               else say("budget_listops", length=LISTOPS_LENGTH))  # fmt: skip
    options = [
        *(["--quick"] if args.quick else []),
        *(f"--{flag}" for flag in ("reuse", "resume") if getattr(args, flag)),
        *(f"--{name} {' '.join(getattr(args, name))}" for name in ("rows", "tasks") if getattr(args, name)),
    ]
    page = say(
        "page",
        options="".join(f" {option}" for option in options),
        mode=say("quick_mode") if args.quick else "full",
        wall_min=f"{wall_min:.1f}",
        provenance=provenance(cells),
        cpu_hours=f"{cpu_hours:.1f}",
        cores=info.get("cores", "2"),
        cpu_hours_max=f"{int(info.get('cores', 2)) * cpu_hours:.1f}",
        seeds_cap=f"; this run: {args.seeds}" if args.seeds else "",
        seeds=say("short_seeds", short=short) if short else say("all_seeds"),
        left="" if args.seeds else left_to_run(remaining_work(rows, cells, cost)),  # --seeds caps what --resume runs
        machine=table(["machine", ""], [[k, v] for k, v in info.items()]),
        quality_table=table(["attention", *(title for _, title, _, _ in quality),
                             *(f"ms/step (peak MiB) n={n}" for n in speed["lengths"]),
                             "LRA (Tay et al. 2021) Image / ListOps %"], body) + notes.markdown(),
        speed=say("speed", **speed) if speed["lengths"] else say("no_speed"),
        extrapolation=say("extrapolation", scalings=", ".join(sorted(SCALED_AT_INFERENCE)), plain_rope=PLAIN_ROPE)
        if any(key == EXTRAPOLATION for key, *_ in quality) else "",
        prior=prior_text(prior, columns),
        opt_in=say("opt_in", columns="; ".join(f"{key} ({why})" for key, why in OPT_IN.items() if key not in shown))
        if set(OPT_IN) - shown else "",
        winners="\n".join(winners(cells, quality, speed, prior) or ["- no numbers yet"]),
        budget=say("quick_budget") if args.quick else say("budget", pixel_steps=PIXEL_STEPS, listops=listops),
        lra_table=table(["LRA model", "Image", "ListOps", "our row"], [[model, f"{s['Image']:.2f}",
                        f"{s['ListOps']:.2f}", ", ".join(s["rows"])] for model, s in LRA_TABLE_1.items()]),
        zoology=say("zoology", lines="\n".join(zoology)) if zoology else "",
        wall_table=table(["attention", *(title for _, title in trained)], walls),
        cost=cost_section(rows, columns, cost),
        rows_table=table(["row", "found in", "overrides"], [[r.name, r.origin, " ".join(r.overrides)] for r in rows]),
        window="".join(f"{task.window} on {task.key}, " for task in columns if task.window),
        plain_within_block=", ".join(sorted(PLAIN_WITHIN_BLOCK)),
        plain_rope=PLAIN_ROPE,
        left_out=say("left_out", notes="; ".join(notes_rows)) if notes_rows else "",
    )  # fmt: skip
    return re.sub(r"\n{3,}", "\n\n", page).strip("\n") + "\n"  # without the paragraphs that do not apply


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="scaled-down runs: minutes a row on 2 CPU cores (--rows picks a few)")  # fmt: skip
    parser.add_argument("--reuse", action="store_true", help="write the page from the ledger only: run nothing")
    parser.add_argument("--resume", action="store_true", help="keep the jobs that have a record, run the rest")
    parser.add_argument("--rows", nargs="+", help="only these rows (default: every row found)")
    parser.add_argument("--tasks", nargs="+", help="only these columns: vit_digits gpt_char translation_numbers "
                        "clip_digits lra_pixel lra_listops listops mqar_w64 mqar_w128 speed cost (cost alone: of every "
                        "default column)")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=None,
                        help="most seeds per cell (default: 5 for a job under 2 min, else 3; quick 1)")  # fmt: skip
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder holding tinyshakespeare/input.txt")  # fmt: skip
    parser.add_argument("--fashion-mnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--out", type=Path, default=None, help="results folder (default experiments/results[/quick])")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "outputs" / "variant_study")
    parser.add_argument("--ledger", type=Path, default=None,
                        help=f"job records for --resume and --reuse (default <out>/{LEDGER}; none: off)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else None)  # None: study_stats.seeds_required
    args.out = args.out or ROOT / "experiments" / "results" / ("quick" if args.quick else "")
    args.ledger = None if str(args.ledger) == "none" else (args.ledger or args.out / LEDGER)
    args.machine_name = ""  # filled in by main
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch

    import zoo.app.modes  # noqa: F401  (Lightning's console handler binds to the console now, not to a job's log)

    if args.threads:
        torch.set_num_threads(args.threads)  # every job runs in this process, so they all get it
    info = {**machine(), "torch threads": str(torch.get_num_threads())}
    args.machine_name = info["CPU"]
    rows, left_out = discover_rows()
    if args.quick and not args.rows:
        args.rows = list(QUICK_ROWS)  # a check that every column runs, in minutes: two rows (--rows picks others)
    if unknown := sorted(set(args.rows or []) - {row.name for row in rows}):
        raise SystemExit(f"error: unknown rows {unknown}; valid choices: {', '.join(r.name for r in rows)}")
    rows = [row for row in rows if not args.rows or row.name in args.rows]
    columns = selected_columns(args)
    print(f"rows: {', '.join(row.name for row in rows)}; columns: {', '.join(t.key for t in columns)}", flush=True)
    for line in skipped_columns(columns):
        print(line, flush=True)
    cells = run_study(args, rows, columns)
    speed = speed_of(args, rows) if not args.tasks or "speed" in args.tasks else EMPTY_SPEED
    cost = cost_of(args, rows, columns)
    prior = prior_of(args, columns)
    wall_min = (time.perf_counter() - started) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    plot(cells, columns_of(columns), args.out / "variant_study.png", prior, cost)
    path = args.out / "variant_study.md"
    path.write_text(markdown(args, info, rows, left_out, columns, cells, speed, wall_min, prior, cost))
    summary = {"machine": info, "mode": "quick" if args.quick else "full", "wall_min": round(wall_min, 1),
               "rows": [asdict(row) for row in rows], "left_out": left_out,
               "tasks": [{**asdict(task), "needs": [str(p) for p in task.needs]} for task in columns],
               "cells": cells, "speed": speed, "prior": prior, "cost": cost,
               "remaining": remaining_work(rows, cells, cost)}  # fmt: skip
    (args.out / "variant_study.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"\nwrote {path} in {wall_min:.1f} min", flush=True)
    return path


if __name__ == "__main__":
    main()
