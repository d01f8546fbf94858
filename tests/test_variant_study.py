"""experiments/variant_study.py: the rows it finds (also variants registered later), the jobs it runs in-process,
the one-line reasons in place of numbers, the GPT at 4x its block, the speed benchmark and the page it writes."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from experiments import reproduce, variant_study
from tests.helpers import compose_config, tiny_text
from zoo.attention import VARIANTS, AttentionConfig
from zoo.attention.full import FullAttention
from zoo.attention.positions import ROPE_SCALINGS
from zoo.errors import ChoiceError, check_choice


class ModeAttention(FullAttention):
    """A stand-in for a variant that lands later: full attention with an option of named choices."""

    name = "moded"

    def __init__(self, *, mode: str = "plain") -> None:
        super().__init__()
        check_choice("attention.mode", mode, ("plain", "fancy"))
        self.mode = mode


def test_rows_are_every_variant_and_named_setting_and_their_overrides_select_them(tmp_path: Path) -> None:
    rows, left_out = variant_study.discover_rows()
    names = [row.name for row in rows]
    assert set(VARIANTS) <= set(names) and "rope" in names
    # How attention is computed (attention.backend) is no row: the same numbers by definition.
    assert not any("flex" in name or "blockwise" in name for name in names)
    assert left_out == ["backend (AttentionConfig.backend): an implementation choice, same results; no row"]
    assert len({json.dumps(row.attention, sort_keys=True) for row in rows}) == len(rows)  # no setting twice
    for row in rows:
        cfg = compose_config(["model=vit", *row.overrides], tmp_path)
        assert AttentionConfig(**cfg.attention).to_dict() == row.attention, row
    scaled = {row.name: row.attention["rope_factor"] for row in rows if row.attention["rope_scaling"]}
    assert scaled == {f"rope+{scaling}": 4.0 for scaling in ROPE_SCALINGS}  # a factor of 1 is plain RoPE


def test_a_variant_registered_later_joins_with_its_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VARIANTS, "moded", ModeAttention)
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    assert rows["moded"].overrides == ("attention.variant=moded",)
    assert rows["moded+fancy"].attention["mode"] == "fancy" and "moded+plain" not in rows  # the default is its row
    assert rows["moded+fancy"].overrides[-1] == "++attention.mode=fancy"


@dataclass(init=False)
class ScaledAttentionConfig(AttentionConfig):
    """A stand-in for a shared option that lands later and builds on RoPE (as RoPE scaling will): one more field."""

    scaling: str | None = None

    def _check(self) -> None:
        super()._check()
        if self.scaling is not None:
            check_choice("attention.scaling", self.scaling, ("ntk",))
        if self.scaling and not self.rope:
            raise ValueError("attention.scaling needs attention.rope=true")


def test_a_shared_option_registered_later_joins_on_the_first_row_that_takes_it(monkeypatch) -> None:
    import zoo.attention

    monkeypatch.setattr(zoo.attention, "AttentionConfig", ScaledAttentionConfig)
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    assert rows["rope+ntk"].overrides == ("attention=rope", "++attention.scaling=ntk")
    assert rows["rope+ntk"].attention["scaling"] == "ntk" and rows["rope+ntk"].attention["rope"] is True
    assert [name for name, row in rows.items() if row.attention["scaling"]] == ["rope+ntk"]  # only RoPE takes it


def test_rows_come_from_the_registry_and_the_config_types_not_from_error_wording(monkeypatch) -> None:
    """Choices are read off the ChoiceError of zoo.errors.check_choice (Kernel.option_choices,
    AttentionConfig.setting_choices): the wording of its message is no API; a toy kernel's choices become rows."""
    before = variant_study.discover_rows()
    monkeypatch.setattr(ChoiceError, "__str__", lambda self: "a message in other words")
    assert variant_study.discover_rows() == before
    monkeypatch.setitem(VARIANTS, "moded", ModeAttention)
    names = [row.name for row in variant_study.discover_rows()[0]]
    assert {"moded", "moded+fancy"} <= set(names) and "moded+plain" not in names
    assert {"linear+relu", "linear+favor", "sparse+fixed", "lsh+bucket", "full+alibi", "rope+yarn"} <= set(names)


def quick_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return variant_study.parse_args(["--quick", "--shared", str(tmp_path / "shared"), "--out", str(tmp_path / "out"),
                                     "--runs-dir", str(tmp_path / "runs"), *extra])  # fmt: skip


def test_a_job_that_cannot_run_shows_its_one_line_error_and_missing_data_skips(tmp_path: Path, capsys) -> None:
    args = quick_args(tmp_path)
    ledger = args.ledger
    row = next(row for row in variant_study.discover_rows()[0] if row.name == "full")
    bad = variant_study.Task("vit_bad", "ViT", "test/acc", True, ("model=vit", "model.net.patch_size=3"))
    result = variant_study.run_job(variant_study.Job(bad, row, 0, tmp_path / "runs" / "bad"), ledger)
    assert result["status"] == "error" and "patch" in result["reason"] and "\n" not in result["reason"]
    assert f"vit_bad / full / seed 0 ... error {result['reason']} (" in capsys.readouterr().out  # the progress line
    again = variant_study.run_job(variant_study.Job(bad, row, 0, tmp_path / "runs" / "bad"), ledger, "reuse")
    assert again == {**result, "reused": True}  # --reuse reads the record instead of running again
    gpt = next(task for task in variant_study.tasks(args) if task.key == "gpt_char")
    skipped = variant_study.run_job(variant_study.Job(gpt, row, 0, tmp_path / "runs" / "gpt"))
    assert skipped["status"] == "skipped" and "input.txt not found" in skipped["reason"]
    assert not (tmp_path / "runs" / "gpt").exists()


def test_additive_attention_runs_only_where_the_sequences_are_short_enough(tmp_path: Path) -> None:
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    longest = variant_study.SPEED_LONGEST["additive"]
    task = variant_study.Task("long", "long", "test/acc", True, ("model=sequence_classifier",), length=longest + 1)
    for mode in ("reuse", "resume", "run"):  # a reason, and nothing run
        result = variant_study.run_job(variant_study.Job(task, rows["additive"], 0, tmp_path / "a"), None, mode)
        assert result == {"status": "error", "reason": f"not run beyond n={longest}: additive attention's step grows "
                          "as n^2 * d"}  # fmt: skip
        assert not (tmp_path / "a").exists()
    full = variant_study.run_job(variant_study.Job(task, rows["full"], 0, tmp_path / "f"), None, "reuse")
    assert full == variant_study.NOT_RUN  # other rows take the long task
    short = replace(task, length=longest)
    at_limit = variant_study.run_job(variant_study.Job(short, rows["additive"], 0, tmp_path / "s"), None, "reuse")
    assert at_limit == variant_study.NOT_RUN  # up to the limit additive attention runs


def test_the_page_says_what_remains_to_run_and_how_long_it_should_take() -> None:
    def cell(*results: dict) -> dict:
        return {"runs": list(results), **variant_study.summarise(list(results))}

    def ok(value: float, wall: float) -> dict:
        return {"status": "ok", "value": value, "wall_s": wall}

    names = {"full": {}, "local": {}, "sparse": {}, "additive": {}, "rope+dynamic": {"rope_scaling": "dynamic"}}
    rows = [variant_study.Row(name, (), {"variant": name, **extra}, "test") for name, extra in names.items()]
    cannot = {"status": "error", "reason": "not run beyond n=256"}
    cells = {
        "full": {"t": cell(ok(1, 100), ok(2, 100), ok(3, 100)), "gpt_char@4x": cell(variant_study.NOT_RUN)},
        "local": {"t": cell(variant_study.NOT_RUN)},  # no job yet: timed through the cost pass against full's
        "sparse": {"t": cell(variant_study.NOT_RUN)},  # nor a cost record: no estimate
        "additive": {"t": cell(cannot)},  # its reason is its cell: nothing to run
        "rope+dynamic": {"t": cell(variant_study.NOT_RUN)},  # the rope row's jobs
    }  # fmt: skip
    cost = {"t": {"full": {"status": "ok", "step_ms": 10.0}, "local": {"status": "ok", "step_ms": 20.0}}}
    left = variant_study.remaining_work(rows, cells, cost)
    # full: 2 more seeds of 100 s (its jobs take under 2 minutes: 5 needed); local: 3 of 2 x 100 s; sparse: 3 unknown
    assert left == {"cells": 3, "jobs": 8, "hours": round(800 / 3600, 1), "unknown": 3}
    text = variant_study.left_to_run(left)
    assert (
        "To complete the page: 8 job(s) in 3 cell(s), about 0.2 hours" in text and "3 job(s) with no estimate" in text
    )
    assert variant_study.left_to_run({"cells": 0, "jobs": 0, "hours": 0.0, "unknown": 0}) == ""


def test_a_cell_runs_the_seeds_the_page_says_it_needs(tmp_path: Path, monkeypatch) -> None:
    """--resume runs a cell's seeds up to the page's count: the first seed's job time decides it (later seeds, on
    a slower host or beside other jobs, neither stop the cell short nor hide a recorded seed)."""
    walls = [100.0, 200.0, 200.0, 200.0, 100.0]  # the first job under 2 minutes, most of the others over it
    ran = []

    def fake_job(job, *args, **kwargs) -> dict:
        ran.append(job.seed)
        return {"status": "ok", "value": 1.0, "wall_s": walls[job.seed]}

    monkeypatch.setattr(variant_study, "run_job", fake_job)
    args = quick_args(tmp_path)
    args.quick, args.seeds = False, None  # the full study's rule: 5 seeds under 2 minutes, else 3
    task = variant_study.Task("t", "T", "test/acc", True, ())
    row = variant_study.Row("full", (), {"variant": "full"}, "test")
    cell = variant_study.run_study(args, [row], [task])["full"]["t"]
    assert ran == [0, 1, 2, 3, 4] and cell["required"] == 5 and len(cell["values"]) == 5
    slow_first = [{"status": "ok", "value": 1.0, "wall_s": wall} for wall in (200.0, 100.0, 100.0)]
    assert variant_study.summarise(slow_first)["required"] == 3  # the first job over 2 minutes: 3, as the runner


def test_a_column_without_its_data_is_announced_with_the_option_that_finds_it(tmp_path: Path) -> None:
    args = variant_study.parse_args(["--quick", "--shared", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    lines = variant_study.skipped_columns(variant_study.tasks(args))
    gpt = [line for line in lines if "gpt_char" in line]
    assert gpt == [f"skipping the gpt_char column: {tmp_path / 'nowhere' / 'tinyshakespeare' / 'input.txt'} not found "
                   "(pass --shared <the folder that holds it>)"]  # fmt: skip


def test_finished_jobs_go_to_the_ledger_and_reuse_takes_them_from_it(tmp_path: Path, monkeypatch) -> None:
    """The full study spans sessions: a job that ended with a number is recorded in the ledger (committed with the
    results), and --reuse takes it from there when its job folder is gone; a one-line error is kept too (--reuse
    shows its reason) and redone by --resume; a failure is not kept."""
    values = iter([0.91, 0.5])

    def fake_run(arguments: list[str], log: Path) -> int:
        folder = Path(next(a for a in arguments if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        (folder / "metrics.json").write_text(json.dumps({"test/acc": next(values)}))
        log.write_text("")
        return 0

    monkeypatch.setattr(variant_study, "run_in_process", fake_run)
    row = variant_study.Row("full+kv_heads=1", ("++attention.kv_heads=1",), {}, "test")
    task = variant_study.Task("vit_digits", "ViT", "test/acc", True, ("model=vit",))
    ledger = tmp_path / "results" / variant_study.LEDGER
    job = variant_study.Job(task, row, 2, tmp_path / "runs" / "a")
    first = variant_study.run_job(job, ledger, machine_name="CPU X")
    kept_file = ledger / "vit_digits" / "full+kv_heads-1-seed2.json"
    assert first["status"] == "ok" and first["value"] == 0.91 and first["machine"] == "CPU X"
    assert json.loads(kept_file.read_text()) == first
    elsewhere = variant_study.Job(task, row, 2, tmp_path / "other-session" / "a")  # no job folder there
    again = variant_study.run_job(elsewhere, ledger, "reuse")
    assert again == {**first, "reused": True} and not elsewhere.folder.exists()
    fresh = variant_study.run_job(elsewhere, ledger, machine_name="CPU Y")
    assert fresh["value"] == 0.5 and json.loads(kept_file.read_text())["machine"] == "CPU Y"  # rerun: replaced
    cells = {"full": {"vit_digits": {"runs": [first, again]}}}
    text = variant_study.provenance(cells)
    assert "1 of the 2 jobs with a number ran in this run; 1 were measured earlier" in text and "CPU X" in text
    assert "bf16-mixed" not in text  # one kind of machine: no precision note
    native = {**again, "machine": "CPU Z (AVX512, bf16 native)"}
    text = variant_study.provenance({"full": {"vit_digits": {"runs": [first, again, native]}}})
    assert "trains in bf16-mixed on the machines marked bf16 native and in fp32 on the others" in text
    assert variant_study.provenance({"full": {"vit_digits": {"runs": [first]}}}).startswith("Every job ran")
    bad = variant_study.Task("vit_bad", "ViT", "test/acc", True, ("model=vit",))
    monkeypatch.setattr(variant_study, "run_in_process", lambda arguments, log: log.write_text("error: no") and 2)
    error = variant_study.run_job(variant_study.Job(bad, row, 0, tmp_path / "runs" / "b"), ledger)
    assert error["status"] == "error" and json.loads((ledger / "vit_bad" / "full+kv_heads-1-seed0.json").read_text())
    shown = variant_study.run_job(variant_study.Job(bad, row, 0, tmp_path / "c"), ledger, "reuse")
    assert shown["reason"] == "no" and shown["reused"]  # --reuse: the reason, from the ledger
    calls = []

    def still_bad(arguments: list[str], log: Path) -> int:
        calls.append(arguments)
        log.write_text("error: still no")
        return 2

    monkeypatch.setattr(variant_study, "run_in_process", still_bad)
    redone = variant_study.run_job(variant_study.Job(bad, row, 0, tmp_path / "c"), ledger, "resume")
    assert len(calls) == 1 and redone["reason"] == "still no"
    monkeypatch.setattr(variant_study, "run_in_process", lambda arguments, log: log.write_text("Traceback") and 1)
    failed = variant_study.run_job(variant_study.Job(bad, row, 1, tmp_path / "runs" / "d"), ledger)
    assert failed["status"] == "failed" and not (ledger / "vit_bad" / "full+kv_heads-1-seed1.json").exists()
    assert variant_study.parse_args(["--ledger", "none"]).ledger is None
    assert variant_study.parse_args(["--out", str(tmp_path)]).ledger == tmp_path / variant_study.LEDGER


@pytest.mark.parametrize("status", [130, 138, 143])
def test_a_job_stopped_by_a_signal_stops_the_study(status: int, tmp_path: Path, monkeypatch) -> None:
    # run.py takes Ctrl-C / SIGUSR1 / SIGTERM as "save and stop"; in-process, the study must stop with it.
    def stopped(overrides):
        raise SystemExit(status)

    monkeypatch.setattr(variant_study.zoo.app, "run", stopped)
    with pytest.raises(SystemExit, match=r"the study was stopped .*--resume continues it"):
        variant_study.run_in_process(["model=vit"], tmp_path / "job.log")
    monkeypatch.setattr(variant_study.zoo.app, "run", lambda overrides: {})
    assert variant_study.run_in_process(["model=vit"], tmp_path / "job.log") == 0


def tiny_gpt_task(tmp_path: Path) -> variant_study.Task:
    text = tiny_text(tmp_path / "shared" / "tinyshakespeare" / "input.txt")
    return variant_study.Task("gpt_char", "GPT", "val/loss", False, (
        "experiment=gpt_shakespeare_char", f"data.path={text}", "model.compile=false", "model.net.n_layer=1",
        "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "data.eval_batches=2", "model.sample.max_new_tokens=0",
        f"paths.data_dir={tmp_path}",
    ))  # fmt: skip


@pytest.mark.parametrize(
    "attention, extrapolates",
    [("attention=rope", True), ("attention=full", False), ("attention=rope,++attention.rope_scaling=dynamic", True)],
    ids=["rope", "learned", "rope_dynamic"],
)
def test_the_gpt_is_evaluated_at_4x_its_block_where_its_weights_allow(tmp_path: Path, attention, extrapolates):
    task = tiny_gpt_task(tmp_path)
    overrides = tuple(attention.split(","))
    row = variant_study.Row(overrides[0].split("=")[1] + ("_dynamic" if len(overrides) > 1 else ""), overrides, {}, "t")
    job = variant_study.Job(task, row, 0, tmp_path / "runs" / row.name)
    assert variant_study.run_job(job)["status"] == "ok"
    result = variant_study.extrapolation(job, quick=True)
    if extrapolates:
        assert result["status"] == "ok" and result["block"] == 64 and 0 < result["value"] < 10
        # Plain RoPE runs in a GPT of the longer block; scaled RoPE as trained (dynamic NTK scales from 16).
        assert result["model_block"] == (16 if len(overrides) > 1 else 64)
    else:
        assert result["status"] == "error" and "wpe.weight is (16, 16) for block 16" in result["reason"]


def test_step_times_measure_every_row_at_every_length() -> None:
    rows = [row for row in variant_study.discover_rows()[0] if row.name in ("full", "linear")]
    speed = variant_study.step_times(rows, quick=True, shapes={32: (256, None), 48: (16, 0)})
    assert speed["lengths"] == [32, 48]
    assert all(speed["rows"][row.name][n]["status"] == "ok" for row in rows for n in (32, 48)), speed
    assert all(speed["rows"][row.name][n]["peak_mib"] > 0 for row in rows for n in (32, 48))  # one step's tensors
    assert torch.get_num_threads() == speed["threads"]
    additive = [row for row in variant_study.discover_rows()[0] if row.name == "additive"]
    speed = variant_study.step_times(additive, quick=True, shapes={16: (16, 0), 4000: (16, 0)})
    assert speed["rows"]["additive"][16]["status"] == "ok"
    assert speed["rows"]["additive"][4000]["reason"].startswith("not timed beyond n=256: additive attention")


def test_the_page_has_numbers_reasons_anchors_winners_and_the_plot(tmp_path: Path) -> None:
    args = quick_args(tmp_path)
    rows = [variant_study.Row(name, (), {"variant": name}, "test") for name in ("full", "local", "compressed")]
    columns = [task for task in variant_study.tasks(args) if task.key in ("vit_digits", "gpt_char")]

    def ok(values: list[float], wall: float | None) -> dict:
        return variant_study.summarise([{"status": "ok", "value": v, "wall_s": wall} for v in values])

    reason = "causal attention is not supported by variant 'compressed'; valid choices: ['full', 'local']"
    cells = {
        "full": {"vit_digits": ok([0.95, 0.97, 0.96], 60), "gpt_char": ok([1.9], 120),
                 "gpt_char@4x": {"median": None, "values": [], "wall_s": None, "reason": "wpe.weight is (64, 128)"}},
        "local": {"vit_digits": ok([0.98], 50), "gpt_char": ok([1.95], 100), "gpt_char@4x": ok([2.1], None)},
        "compressed": {"vit_digits": ok([0.9], 40), "gpt_char": {"median": None, "values": [], "wall_s": 1,
                                                                 "reason": reason}},
    }  # fmt: skip

    def timed(short: list[float], long: list[float]) -> dict:  # the timing rounds at n=784 and n=2000
        return {n: {"status": "ok", "value": sorted(r)[1], "rounds": r} for n, r in ((784, short), (2000, long))}

    speed = {"batch": 4, "steps": 2, "rounds": 3, "threads": 2, "lengths": [784, 2000],
             "rows": {"full": timed([82.0, 90.0, 125.0], [880.0, 900.0, 920.0]),
                      "local": timed([78.0, 80.0, 95.0], [290.0, 300.0, 310.0])}}  # fmt: skip
    text = variant_study.markdown(args, {"CPU": "test"}, rows, [], columns, cells, speed, 1.5)
    # median [95% interval] n=<seeds>/<needed>; one seed of the ViT's 5 beats full's median: no winner, all tied
    assert ("| full | 0.960 [0.950, 0.970] n=3/5 ≈ best | 1.9000 n=1/3 ≈ best | [1] | 90 (not measured) | "
            "900 (not measured) | Transformer: 42.44 / 36.37 |") in text  # fmt: skip
    assert "| compressed | 0.900 n=1/5 ≈ best | [2] | not run | not run | not run | Linformer: 38.56 / 35.70 |" in text
    assert f"[2] {reason}" in text and "[1] wpe.weight is (64, 128)" in text
    assert "| compressed | 40 | - |" in text  # wall seconds of jobs that trained; none for one that could not start
    assert "- ViT digits (test acc): no clear winner (best median local: 0.980, 1 seed(s); too few seeds" in text
    assert "tied with it: full, compressed (3 rows with a number)" in text
    # speed by the same rule, over the timing rounds: full's median lies inside local's interval at 784, not at 2000
    assert ("- training step at n=2000: **local** (300 ms [290, 310], 3 timing round(s); its interval excludes the "
            "median of every other of the 2 rows timed)") in text  # fmt: skip
    assert ("- training step at n=784: no clear winner (best median local: 80 ms [78, 95], 3 timing round(s); rows "
            "inside its interval); tied with it: full (2 rows timed)") in text  # fmt: skip
    assert "- GPT tiny-shakespeare char (val loss): no clear winner (best median full: 1.9000" in text
    assert "Compute: the jobs on this page took 0.1 hours of wall time on 2 cores (at most 0.3 CPU hours)" in text
    assert "6 cell(s) have fewer seeds than needed" in text
    assert "To complete the page" not in text  # --quick's one seed: --resume with it would run none of them
    assert "| Performer | 42.77 | 18.01 | favor, linear+favor |" in text and "smaller" in text
    assert (
        f"Local attention's window: {variant_study.SHORT_WINDOW} on vit_digits, {variant_study.GPT_WINDOW} on "
        "gpt_char, conf/attention/local"
    ) in text
    assert "stretches the rope row's weights of the same seed by 4 at inference" in text  # how the 4x column is read
    assert "dynamic is plain RoPE within the trained block: its rows' training cells are the rope row's jobs" in text
    # five seeds each, far apart: a clear winner, in bold, and the page's list names it
    cells["full"]["vit_digits"] = ok([0.95, 0.97, 0.96, 0.96, 0.955], 60)
    cells["local"]["vit_digits"] = ok([0.90, 0.91, 0.92, 0.905, 0.91], 60)
    text = variant_study.markdown(args, {"CPU": "test"}, rows, [], columns, cells, speed, 1.5)
    assert "| full | **0.960 [0.950, 0.970] n=5/5** winner |" in text
    assert "- ViT digits (test acc): **full** (0.960 [0.950, 0.970], 5 seed(s); its interval excludes" in text
    # the plot's x: the cost pass's step time where every row with a number has one, else the jobs' wall seconds
    cost = {"vit_digits": {"full": 30.0, "local": 20.0, "compressed": 25.0}, "gpt_char": {"local": 9.0}}
    cost = {key: {name: {"status": "ok", "step_ms": ms} for name, ms in row.items()} for key, row in cost.items()}
    steps = ("ms per training step, cost pass (log)", {"full": 30.0, "local": 20.0, "compressed": 25.0})
    assert variant_study.plot_times(cells, "vit_digits", cost) == steps
    assert variant_study.plot_times(cells, variant_study.EXTRAPOLATION, cost)[1] == {"local": 9.0}  # GPT's training
    cost["vit_digits"]["compressed"] = {"status": "error", "reason": "no"}
    walls = ("wall seconds per job (log)", {"full": 60, "local": 60, "compressed": 40})
    assert variant_study.plot_times(cells, "vit_digits", cost) == walls
    variant_study.plot(cells, variant_study.columns_of(columns), tmp_path / "plot.png", cost=cost)
    assert (tmp_path / "plot.png").stat().st_size > 1000
    variant_study.plot(cells, [], tmp_path / "speed_only.png")  # --tasks speed: nothing to draw, no error
    assert not (tmp_path / "speed_only.png").exists()
    (tmp_path / "variant_study.md").write_text(text)
    section = reproduce.variant_study_markdown(tmp_path)  # what RESULTS.md shows of it
    assert "[variant_study.md](variant_study.md)" in section and "**full** (0.960" in section


def test_a_timing_recorded_before_its_kernel_got_faster_is_footnoted(monkeypatch) -> None:
    monkeypatch.setattr(variant_study, "KERNEL_CHANGES", {"additive": ("2026-12-07 12:00", "results/x.md")})
    rows = [variant_study.Row(name, (), {"variant": name}, "test") for name in ("full", "additive")]
    columns = [variant_study.Task("vit_digits", "ViT", "test/acc", True, ())]

    def cost(full: str, additive: str) -> dict:
        stamp = {"status": "ok", "peak_mib": 1.0, "machine": "m", "threads": 1}
        return {"vit_digits": {"full": {**stamp, "step_ms": 30.0, "date": full},
                               "additive": {**stamp, "step_ms": 80.0, "date": additive}}}  # fmt: skip

    before = variant_study.cost_section(rows, columns, cost("2026-12-06 22:00", "2026-12-06 22:00"))
    assert "| full | 30 (1.0) |" in before  # another row's kernel did not change
    assert "| additive | 80 (1.0) [1] |" in before
    assert "[1] measured before a faster additive kernel landed (2026-12-07 12:00); results/x.md measures it" in before
    after = variant_study.cost_section(rows, columns, cost("2026-12-06 22:00", "2026-12-07 13:00"))
    assert "| additive | 80 (1.0) |" in after and "[1]" not in after


def test_every_job_of_every_row_is_a_command_line_hydra_parses(tmp_path: Path) -> None:
    """A row named after an option's value (full+kv_heads=1) once gave a job folder that broke hydra.run.dir."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    args = quick_args(tmp_path)
    for task in variant_study.tasks(args):
        for row in variant_study.discover_rows()[0]:
            job = variant_study.Job(task, row, 0, variant_study.job_folder(tmp_path / "runs", task, row, 0))
            parsed = parser.parse_overrides(job.arguments)
            folder = next(o.value() for o in parsed if o.key_or_group == "hydra.run.dir")
            assert Path(folder) == job.folder and job.folder.parent == tmp_path / "runs" / task.key


def test_the_full_study_trains_the_long_range_columns_on_a_fixed_budget(tmp_path: Path) -> None:
    """LRA's way (a number of steps), not the experiment configs' epochs: those, times every row, take days here."""
    args = variant_study.parse_args(["--shared", str(tmp_path), "--fashion-mnist", str(tmp_path / "fmnist")])
    columns = {task.key: task for task in variant_study.tasks(args)}
    pixel = variant_study.compose(list(columns["lra_pixel"].overrides), tmp_path / "pixel")
    assert pixel.trainer.max_steps == pixel.trainer.val_check_interval == variant_study.PIXEL_STEPS
    assert pixel.data.max_length == 784 and pixel.data.images.data_dir == str(tmp_path / "fmnist")
    listops = variant_study.compose(list(columns["lra_listops"].overrides), tmp_path / "listops")
    assert listops.data.num_train == variant_study.LISTOPS_TRAIN and listops.trainer.max_epochs == 1
    assert listops.data.max_length == 2000
    for config in (pixel, listops):
        assert config.trainer.limit_val_batches == variant_study.LRA_VAL_BATCHES
    assert f"{variant_study.PIXEL_STEPS} steps" in columns["lra_pixel"].title
    assert f"{variant_study.LISTOPS_TRAIN} expressions" in columns["lra_listops"].title


def test_the_4x_evaluation_keeps_its_number_and_its_error_in_the_ledger(tmp_path: Path, monkeypatch) -> None:
    """A later --reuse finds the GPT's record in the ledger but not its checkpoint: the 4x cell must come from the
    ledger too (its error, a weight shaped by the block, is a fact of the row); a failure is redone."""
    outcomes = iter([{"status": "error", "reason": "wpe.weight is (64, 128) for block 64"},
                     {"status": "failed", "reason": "FileNotFoundError: last.ckpt"}])  # fmt: skip
    monkeypatch.setattr(variant_study, "extrapolation", lambda job, quick: next(outcomes))
    args = quick_args(tmp_path, "--resume")
    task = variant_study.Task("gpt_char", "GPT", "val/loss", False, ())
    row = variant_study.Row("full", (), {}, "test")
    job = variant_study.Job(task, row, 0, tmp_path / "runs" / "full-seed0")
    first = variant_study.longer_block(job, {"status": "ok"}, args)
    kept_file = args.ledger / "gpt_char" / "full-seed0.extrapolation.json"
    assert first["status"] == "error" and json.loads(kept_file.read_text()) == first
    elsewhere = variant_study.Job(task, row, 0, tmp_path / "other-session" / "full-seed0")
    assert variant_study.longer_block(elsewhere, {"status": "ok"}, args) == first  # not evaluated again
    seed1 = variant_study.Job(task, row, 1, tmp_path / "runs" / "full-seed1")
    assert variant_study.longer_block(seed1, {"status": "ok"}, args)["status"] == "failed"
    assert not (args.ledger / "gpt_char" / "full-seed1.extrapolation.json").exists()


def test_local_attention_gets_a_window_shorter_than_each_short_task(tmp_path: Path) -> None:
    """conf/attention/local.yaml's 256 covers a 17-token digit image: local attention would be full attention there
    (the first digits rows of local and full were the same numbers); only local's jobs get the task's window (another
    variant refuses it), the GPT recipe's too: experiment=gpt_shakespeare_char sets none, for it runs every variant."""
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    full_mode = variant_study.parse_args(["--shared", str(tmp_path)])
    for args in (quick_args(tmp_path), full_mode):
        for task in variant_study.tasks(args):
            local, full = (variant_study.Job(task, rows[name], 0, tmp_path / name) for name in ("local", "full"))
            assert [a for a in local.arguments if "attention.window" in a] == (
                [f"++attention.window={task.window}"] if task.window else []
            )
            assert not [a for a in full.arguments if "attention.window" in a]
    short = [task for task in variant_study.tasks(full_mode) if task.window]
    assert {task.key for task in short} == {"vit_digits", "gpt_char", "translation_numbers", "clip_digits", "listops",
                                            "mqar_w64", "mqar_w128"}  # fmt: skip
    vit = variant_study.Job(short[0], rows["local"], 0, tmp_path / "vit")
    window = [argument for argument in vit.arguments if "attention.window" in argument]
    config = variant_study.compose([*vit.task.overrides, *vit.row.overrides, *window], tmp_path / "vit")
    tokens = (config.data.image_size // config.data.patch_size) ** 2 + 1
    assert config.attention.variant == "local" and config.attention.window == variant_study.SHORT_WINDOW < tokens


def test_linear_and_ntk_rope_scaling_stretch_the_plain_rope_weights_at_4x(tmp_path: Path) -> None:
    """Position interpolation and NTK-aware scaling are applied at inference to a model trained with plain RoPE;
    the rope+linear / rope+ntk rows trained with the scaling on (positions compressed 4x from the first step)."""
    task, runs = tiny_gpt_task(tmp_path), tmp_path / "runs"
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    jobs = {name: variant_study.Job(task, rows[name], 0, variant_study.job_folder(runs, task, rows[name], 0))
            for name in ("rope", "rope+linear", "rope+dynamic")}  # fmt: skip
    missing = variant_study.extrapolation(jobs["rope+linear"], quick=True)
    assert missing["status"] == "failed" and "rope-seed0" in missing["reason"] and "run it first" in missing["reason"]
    for name in ("rope+linear", "rope"):
        assert variant_study.run_job(jobs[name])["status"] == "ok"
    plain, stretched, dynamic = (variant_study.extrapolation(jobs[name], quick=True) for name in jobs)
    assert plain["weights"] == stretched["weights"] == dynamic["weights"] == "rope-seed0" and stretched["block"] == 64
    assert stretched["status"] == dynamic["status"] == "ok" and stretched["value"] != plain["value"] != dynamic["value"]
    assert stretched["model_block"] == dynamic["model_block"] == 16  # the trained length: scaling stretches it by 4


def test_dynamic_rope_scaling_takes_the_rope_rows_jobs_after_a_one_batch_run_of_its_own(tmp_path, monkeypatch):
    """Dynamic NTK is plain RoPE within the trained block: training its row again repeats the rope row's jobs (the
    same numbers, seed for seed; 8-13 min a job on the long-range columns). A one-batch run of the row itself still
    shows where it cannot run (a ViT's 2-axis grid)."""
    calls: list[list[str]] = []

    def fake_run(arguments: list[str], log: Path) -> int:
        calls.append(arguments)
        folder = Path(next(a for a in arguments if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        if "model=vit" in arguments:
            log.write_text("error: attention.rope_scaling='dynamic' stretches 1-D sequences\n")
            return 2
        log.write_text("")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps({"val/loss": 1.0 + len(calls)}))
        return 0

    monkeypatch.setattr(variant_study, "run_in_process", fake_run)
    rows = {row.name: row for row in variant_study.discover_rows()[0]}
    args = quick_args(tmp_path, "--seeds", "2")
    seq = variant_study.Task("seq", "sequence", "val/loss", False, ("experiment=lra_pixel",))
    vit = variant_study.Task("vit", "ViT", "val/loss", False, ("model=vit",))
    cells = variant_study.run_study(args, [rows["rope"], rows["rope+dynamic"]], [seq, vit])
    dynamic = cells["rope+dynamic"]["seq"]
    assert dynamic["values"] == cells["rope"]["seq"]["values"] and len(dynamic["values"]) == 2
    assert [run["trained_as"] for run in dynamic["runs"]] == ["rope-seed0", "rope-seed1"]
    one_batch = [a for a in calls if "trainer.fast_dev_run=true" in a and "experiment=lra_pixel" in a]
    assert len(one_batch) == 2 and all("++attention.rope_scaling=dynamic" in a for a in one_batch)
    trained = [a for a in calls if "experiment=lra_pixel" in a and "trainer.fast_dev_run=true" not in a]
    assert len(trained) == 2 and not any("++attention.rope_scaling=dynamic" in a for a in trained)  # rope's only
    assert "stretches 1-D sequences" in cells["rope+dynamic"]["vit"]["reason"]
    error_file = args.ledger / "vit" / "rope+dynamic-seed0.json"  # the one-line error is kept, as run_job's
    assert "stretches 1-D sequences" in json.loads(error_file.read_text())["reason"]
    calls.clear()
    shown = variant_study.run_study(quick_args(tmp_path, "--reuse"), [rows["rope+dynamic"]], [vit])
    assert "stretches 1-D sequences" in shown["rope+dynamic"]["vit"]["reason"] and not calls
    variant_study.run_study(quick_args(tmp_path, "--resume"), [rows["rope+dynamic"]], [vit])
    assert len(calls) == 1 and "trainer.fast_dev_run=true" in calls[0]  # --resume redoes it
    kept_file = args.ledger / "seq" / "rope+dynamic-seed1.json"
    assert json.loads(kept_file.read_text())["trained_as"] == "rope-seed1"
    calls.clear()
    again = variant_study.run_study(quick_args(tmp_path, "--seeds", "2", "--resume"), [rows["rope+dynamic"]], [seq])
    assert again["rope+dynamic"]["seq"]["values"] == dynamic["values"] and not calls  # from the records
    alone = variant_study.run_study(quick_args(tmp_path, "--seeds", "1"), [rows["rope+dynamic"]], [seq])
    assert alone["rope+dynamic"]["seq"]["runs"][0]["trained_as"] == "rope-seed0"  # the rope row's job, run now
    assert json.loads((args.ledger / "seq" / "rope+dynamic-seed0.json").read_text())["trained_as"] == "rope-seed0"


def test_the_long_range_columns_show_the_class_prior_and_a_column_at_it_has_no_winner(tmp_path: Path) -> None:
    """At the full study's budget every ListOps row scored 0.190: the test share of answer 0, i.e. nothing learned
    but the prior. The page must say so rather than crown a 16-way tie."""
    from collections import Counter

    from zoo.data.listops import generate_listops

    args = quick_args(tmp_path)
    columns = {task.key: task for task in variant_study.tasks(args)}
    assert [key for key, task in columns.items() if task.prior] == ["lra_pixel", "lra_listops", "listops"]
    prior = variant_study.priors([columns["lra_pixel"], columns["lra_listops"]], tmp_path / "prior")
    assert set(prior) == {"lra_pixel", "lra_listops"}
    # quick ListOps: 480 | 64 | 64 expressions of 64-256 tokens, split in drawing order
    answers = Counter(answer for _, answer in generate_listops(608, 64, 256, seed=0)[544:])
    top, count = answers.most_common(1)[0]
    assert prior["lra_listops"] == {"status": "ok", "value": count / 64, "class": str(top), "test_size": 64}
    assert 0.1 <= prior["lra_pixel"]["value"] < 0.2 and prior["lra_pixel"]["class"] in "0123456789"
    missing = variant_study.Task("fm", "FM", "test/acc", True, ("experiment=lra_pixel",), (tmp_path / "nope*",),
                                 prior=True)  # fmt: skip
    assert variant_study.most_common_share(missing, tmp_path / "m")["status"] == "skipped"

    quality = [("lra_listops", "ListOps (test acc)", 3, True)]
    share = {"lra_listops": {"status": "ok", "value": 0.19, "class": "0", "test_size": 1000}}
    at_prior = {name: {"lra_listops": {"median": 0.19, "values": [0.19]}} for name in ("full", "linear")}
    speed = {"lengths": [], "rows": {}}
    (line,) = variant_study.winners(at_prior, quality, speed, share)
    assert "**no row** above the most common class's share (0.190, class 0)" in line and "none of the 2 row(s)" in line
    above = {**at_prior, "full": {"lra_listops": {"median": 0.25, "values": [0.25]}}}
    (line,) = variant_study.winners(above, quality, speed, share)
    assert line.startswith("- ListOps (test acc): no clear winner (best median full: 0.250, 1 seed(s)")
    # The plot draws the prior and greys the rows on it (drawn without the prior, the picture differs).
    timed = {name: {"lra_listops": {**cell["lra_listops"], "wall_s": 60.0 + i}} for i, (name, cell) in
             enumerate(at_prior.items())}  # fmt: skip
    variant_study.plot(timed, quality, tmp_path / "with.png", share)
    variant_study.plot(timed, quality, tmp_path / "without.png")
    assert (tmp_path / "with.png").read_bytes() != (tmp_path / "without.png").read_bytes()
    text = variant_study.prior_text(share, [columns["lra_listops"]])
    assert f"{columns['lra_listops'].title}: 0.190 (class 0, of 1000)" in text


def test_reuse_writes_the_page_from_the_ledger_alone_and_runs_nothing(tmp_path: Path, monkeypatch) -> None:
    """`python experiments/variant_study.py --reuse` reassembles the page from the ledger (jobs, speed, priors):
    no job, no timing, no data; a job without a record is "not run", and a cell short of seeds says so."""

    def forbidden(*args, **kwargs):
        raise AssertionError("--reuse ran something")

    for name in ("run_in_process", "step_times", "priors", "extrapolation"):
        monkeypatch.setattr(variant_study, name, forbidden)
    out = tmp_path / "results"
    ledger = out / variant_study.LEDGER
    for seed, value in enumerate([0.95, 0.97, 0.96]):
        record = {"status": "ok", "value": value, "wall_s": 200.0, "seed": seed, "date": "2026-12-01 10:00",
                  "machine": "CPU X", "command": "python run.py model=vit"}  # fmt: skip
        variant_study.write_record(ledger / "vit_digits" / f"full-seed{seed}.json", record)
    speed = {"batch": 32, "steps": 3, "rounds": 3, "threads": 2, "lengths": [784],
             "rows": {"full": {"784": {"status": "ok", "value": 900.0, "peak_mib": 120.0}}}}  # fmt: skip
    variant_study.write_record(ledger / "speed.json", speed)
    variant_study.write_record(ledger / "prior.json", {"lra_pixel": {"status": "ok", "value": 0.1, "class": "3",
                                                                     "test_size": 10}})  # fmt: skip
    probe = {"status": "ok", "step_ms": 12.0, "steps": 7, "peak_mib": 3.5, "batch_size": 64, "threads": 1,
             "date": "2026-12-01 11:00", "machine": "CPU X"}  # fmt: skip
    variant_study.write_record(ledger / variant_study.COST, {"vit_digits": {"full": probe}})
    argv = ["--reuse", "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--rows", "full", "linear",
            "--tasks", "vit_digits", "lra_pixel", "speed", "--shared", str(tmp_path)]  # fmt: skip
    page = variant_study.main(argv).read_text()
    assert "| full | 0.960 [0.950, 0.970] n=3/3 ≈ best | not run | 900 (120) |" in page  # 200 s a job: 3 seeds
    assert "Written by `python experiments/variant_study.py --reuse --rows full linear" in page
    assert "| linear | not run | not run | not run |" in page
    assert "| full | 12 (3.5) | not measured |" in page and "| linear | not measured | not measured |" in page
    assert "3 were measured earlier (2026-12-01 10:00 to 2026-12-01 10:00, on CPU X)" in page
    assert "0.2 hours of wall time" in page and "0.100 (class 3, of 10)" in page
    assert "Columns shown only when --tasks names them (their records stay in the ledger): lra_listops (" in page
    assert not (tmp_path / "runs").exists()


def test_lra_listops_is_a_column_only_when_named(tmp_path: Path) -> None:
    """The ListOps column at LRA's length measures nothing at a CPU's budget: left out unless --tasks names it."""

    def keys(*argv: str) -> list[str]:
        args = variant_study.parse_args(["--shared", str(tmp_path), *argv])
        return [task.key for task in variant_study.selected_columns(args)]

    assert "lra_listops" not in keys() and {"listops", "lra_pixel", "mqar_w64"} <= set(keys())
    assert set(keys()) == {task.key for task in variant_study.tasks(variant_study.parse_args([]))} - {"lra_listops"}
    assert keys("--tasks", "lra_listops", "speed") == ["lra_listops"]
    with pytest.raises(SystemExit, match=r"unknown tasks \['nope'\]; valid choices: .*lra_listops"):
        keys("--tasks", "nope")


def test_the_learning_listops_and_the_mqar_columns_compose_as_their_recipes_say(tmp_path: Path) -> None:
    """ListOps: experiments/listops_recipe.py's chosen candidate, the same test set as its search; MQAR: Zoology's
    64 tokens and 4 pairs (vocabulary 128), a 2-layer one-head GPT at widths 64 and 128, scored on the queries."""
    from experiments.listops_recipe import CANDIDATES

    columns = {task.key: task for task in variant_study.tasks(variant_study.parse_args(["--shared", str(tmp_path)]))}
    listops = variant_study.compose(list(columns["listops"].overrides), tmp_path / "listops")
    chosen = dict(o.lstrip("+").split("=", 1) for o in CANDIDATES[variant_study.LISTOPS_CHOICE])
    assert listops.data.max_length == int(chosen["data.max_length"]) == variant_study.LISTOPS_LENGTH
    assert listops.model.optimizer.lr == float(chosen["model.optimizer.lr"])
    assert listops.trainer.max_steps == int(chosen["trainer.max_steps"]) and listops.data.num_test == 1000
    for width in (64, 128):
        mqar = variant_study.compose(list(columns[f"mqar_w{width}"].overrides), tmp_path / f"mqar{width}")
        assert mqar.model.net.n_embd == width and mqar.model.net.n_layer == 2 and mqar.data.vocab_size == 128
        assert (mqar.data.seq_len, mqar.data.num_kv_pairs) == (64, 4) and mqar.model.net.block_size == 64
        assert mqar.model.net.n_head == 1 and mqar.trainer.max_steps == 2000
        assert mqar.model._target_.endswith("AssociativeRecallTask") and columns[f"mqar_w{width}"].metric == "test/acc"
    quick = {task.key for task in variant_study.tasks(variant_study.parse_args(["--quick"]))}
    assert {"listops", "mqar_w64"} <= quick and "mqar_w128" not in quick


def test_the_zoology_anchor_says_whether_full_attention_is_ahead_of_linear_attention(tmp_path: Path) -> None:
    """Reproduced only when full attention's interval lies above linear attention's (3 seeds each); overlapping
    intervals are "not shown", a linear median as high is "not reproduced"; other rows at full's level or below."""

    def ok(values: list[float]) -> dict:
        return variant_study.summarise([{"status": "ok", "value": v, "wall_s": 200} for v in values])  # 3 needed

    quality = [("mqar_w64", "MQAR w64", 3, True), ("vit_digits", "ViT", 3, True)]
    cells = {"full": {"mqar_w64": ok([0.94, 0.95, 0.96])}, "linear": {"mqar_w64": ok([0.27, 0.28, 0.29])},
             "rope": {"mqar_w64": ok([0.93, 0.96, 0.97])}, "local": {"mqar_w64": ok([0.5, 0.6, 0.7])}}  # fmt: skip
    (line,) = variant_study.zoology_anchor(cells, quality)
    assert "full 0.950, linear 0.280 (3 and 3 seeds): **reproduced**" in line
    assert "At full attention's level (interval overlapping its): rope; below it: local 0.600, linear 0.280" in line
    # on the page, under its own heading, and in RESULTS.md's section
    args = quick_args(tmp_path)
    rows = [variant_study.Row(name, (), {"variant": name}, "test") for name in cells]
    columns = [task for task in variant_study.tasks(args) if task.key == "mqar_w64"]
    speed = {"batch": 0, "steps": 0, "rounds": 0, "threads": 0, "lengths": [], "rows": {}}
    text = variant_study.markdown(args, {"CPU": "test"}, rows, [], columns, cells, speed, 0.1)
    assert "## Published anchor: Zoology (Arora et al. 2023, Figure 2)" in text and "**reproduced**" in text
    assert "Every cell with a number has the seeds it needs." in text and "provisional" not in text  # all 3 of 3
    (tmp_path / "variant_study.md").write_text(text)
    section = reproduce.variant_study_markdown(tmp_path)
    assert "Zoology's ordering" in section and "linear 0.280 (3 and 3 seeds): **reproduced**" in section
    cells["linear"]["mqar_w64"] = ok([0.5, 0.9, 0.955])
    assert (
        "not shown: full attention's median is higher but the intervals overlap"
        in variant_study.zoology_anchor(cells, quality)[0]
    )
    cells["linear"]["mqar_w64"] = ok([0.96, 0.97, 0.98])
    assert "**not reproduced**" in variant_study.zoology_anchor(cells, quality)[0]
    cells["linear"]["mqar_w64"] = ok([0.2])
    assert "too few seeds to say (3 and 1; 3 needed)" in variant_study.zoology_anchor(cells, quality)[0]
    del cells["linear"]
    assert variant_study.zoology_anchor(cells, quality) == [
        "- MQAR w64: not yet measured (full or linear has no number)"
    ]


def test_the_committed_ledger_rebuilds_the_committed_page(tmp_path: Path) -> None:
    """`python experiments/variant_study.py --reuse` writes experiments/results/variant_study.{md,json,png} from the
    committed ledger alone: the committed page, but for the rebuilding machine's table and minutes; every one of the
    603 jobs with a number is read."""
    results = Path(variant_study.ROOT) / "experiments" / "results"
    argv = ["--reuse", "--out", str(tmp_path), "--ledger", str(results / variant_study.LEDGER), "--runs-dir",
            str(tmp_path / "runs")]  # fmt: skip
    page = variant_study.main(argv).read_text()

    def steady(text: str) -> list[str]:  # without what says when, where and how fast the page was written
        text = re.sub(r"\) in [\d.]+ min\. Every number", ") in - min. Every number", text)
        return [part for part in text.split("\n\n") if not part.startswith("| machine |")]

    assert steady(page) == steady((results / "variant_study.md").read_text())
    built, committed = (json.loads((folder / "variant_study.json").read_text()) for folder in (tmp_path, results))
    for summary in (built, committed):  # the machine, the minutes, and the data paths of the rebuilding host
        summary.pop("machine"), summary.pop("wall_min")
        summary["tasks"] = [task["key"] for task in summary["tasks"]]
    assert built == committed
    # Every job with a number in the ledger's shown columns is on the page, but seeds beyond their cell's count (its
    # first job took over 2 minutes: 3 seeds; some cells kept seeds 3-4 from before that rule).
    runs = [{k: v for k, v in run.items() if k != "reused"} for row in built["cells"].values()
            for key, cell in row.items() if key != variant_study.EXTRAPOLATION for run in cell["runs"]]  # fmt: skip
    ok = [record for path in (results / variant_study.LEDGER).glob("*/*-seed*.json")
          if path.parent.name in built["tasks"] and not path.name.endswith(".extrapolation.json")
          and (record := json.loads(path.read_text()))["status"] == "ok"]  # fmt: skip
    unread = [record for record in ok if record not in runs]
    assert all(record["seed"] >= 3 for record in unread) and len(unread) < 10
    shown = len(ok) - len(unread)
    assert f"0 of the {shown} jobs with a number ran in this run; {shown} were measured earlier" in page
    assert (tmp_path / "variant_study.png").stat().st_size > 10_000


def test_every_block_of_the_page_template_is_shown_by_the_page_writer() -> None:
    """experiments/variant_study_page.md holds the page's words: a block the code never names is dead prose."""
    source = Path(variant_study.__file__).read_text()
    assert "page" in variant_study.blocks() and "cost" in variant_study.blocks()
    assert [name for name in variant_study.blocks() if f'"{name}"' not in source] == []
