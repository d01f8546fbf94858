"""experiments/step_cost.py: the step time and peak memory a run measures of itself (the variant study's cost
pass), and the cost pass of experiments/variant_study.py that runs it on every row and column."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from experiments import variant_study
from experiments.step_cost import StepCost

EXTRA_MIB = 8


class Tiny(L.LightningModule):
    """A linear model whose training step holds `extra_mib` more tensor memory at once (a stand-in for a kernel
    that materialises a larger score matrix)."""

    def __init__(self, extra_mib: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.extra = extra_mib * 2**20 // 4

    def training_step(self, batch, batch_idx):
        (x,) = batch
        scratch = torch.ones(self.extra) if self.extra else torch.zeros(1)
        return self.layer(x).pow(2).mean() + scratch.sum() * 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)


def cost(tmp_path: Path, extra_mib: int) -> dict:
    path = tmp_path / f"cost{extra_mib}.json"
    trainer = L.Trainer(max_steps=6, callbacks=[StepCost(str(path), warmup=2)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Tiny(extra_mib))
    return json.loads(path.read_text())


def test_step_cost_times_the_steps_after_the_warm_up_and_profiles_the_last_ones_memory(tmp_path: Path) -> None:
    plain, larger = cost(tmp_path, 0), cost(tmp_path, EXTRA_MIB)
    assert plain["steps"] == larger["steps"] == 3  # steps 2, 3, 4 of 0-5: two warm up, the last is profiled
    assert plain["step_ms"] > 0 and plain["batch_size"] == 4
    assert 0 < plain["peak_mib"] < 1  # the model's gradients and activations: kilobytes
    assert larger["peak_mib"] - plain["peak_mib"] == pytest.approx(EXTRA_MIB, abs=0.1)


def fake_probe_run(outcomes: dict[str, int]):
    """run_in_process for the cost pass: writes StepCost's record (or exits 2 with a one-line error) per row."""
    calls: list[str] = []

    def run(arguments: list[str], log: Path) -> int:
        attention = next(a for a in arguments if a.startswith("attention=")).split("=", 1)[1]
        calls.append(attention)
        if outcomes[attention] == 2:
            log.write_text(f"error: attention={attention} cannot run this task\n")
            return 2
        out = Path(next(a for a in arguments if a.startswith("+callbacks.step_cost.path=")).split("=", 1)[1])
        out.write_text(json.dumps({"step_ms": 12.0, "steps": 7, "peak_mib": 3.5, "batch_size": 64}))
        return 0

    return run, calls


def test_the_cost_pass_records_each_row_and_column_and_resume_measures_only_what_it_lacks(
    tmp_path: Path, monkeypatch
) -> None:
    args = variant_study.parse_args(["--quick", "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"),
                                     "--tasks", "vit_digits", "cost"])  # fmt: skip
    args.machine_name = "CPU X"
    rows = [row for row in variant_study.discover_rows()[0] if row.name in ("full", "compressed")]
    columns = variant_study.selected_columns(args)
    job = variant_study.Job(columns[0], rows[0], 0, tmp_path / "job")
    arguments = variant_study.cost_arguments(job, tmp_path / "out.json")
    keys = [a.split("=", 1)[0].lstrip("+") for a in arguments]
    assert len(keys) == len(set(keys)) and f"trainer.max_steps={variant_study.COST_STEPS}" in arguments
    assert "test=false" in arguments and "trainer.limit_val_batches=0" in arguments

    run, calls = fake_probe_run({"full": 0, "compressed": 2})
    monkeypatch.setattr(variant_study, "run_in_process", run)
    cost = variant_study.cost_of(args, rows, columns)
    assert cost["vit_digits"]["full"]["step_ms"] == 12.0 and cost["vit_digits"]["full"]["machine"] == "CPU X"
    assert cost["vit_digits"]["compressed"] == {**cost["vit_digits"]["compressed"], "status": "error",
                                                "reason": "attention=compressed cannot run this task"}  # fmt: skip
    assert calls == ["full", "compressed"]
    assert json.loads((args.ledger / variant_study.COST).read_text()) == cost  # kept in the ledger

    args.resume = True  # a recorded number is kept; a one-line error is measured again (seconds)
    assert variant_study.cost_of(args, rows, columns)["vit_digits"]["full"] == cost["vit_digits"]["full"]
    assert calls == ["full", "compressed", "compressed"]
    args.resume, args.reuse = False, True
    variant_study.cost_of(args, rows, columns)
    assert calls == ["full", "compressed", "compressed"]  # --reuse runs nothing

    section = variant_study.cost_section(rows + [variant_study.Row("linear", (), {}, "test")], columns, cost)
    assert "| full | 12 (3.5) |" in section and "| compressed | [1] |" in section
    assert "| linear | not measured |" in section and "[1] attention=compressed cannot run this task" in section
    assert f"on CPU X, {torch.get_num_threads()} torch thread(s) a run." in section


def test_cost_alone_measures_every_default_column_and_a_column_named_with_it_alone(tmp_path: Path) -> None:
    def cost_keys(*argv: str) -> list[str]:
        args = variant_study.parse_args(["--shared", str(tmp_path), *argv])
        return [task.key for task in variant_study.cost_columns(args, variant_study.selected_columns(args))]

    default = [task.key for task in variant_study.selected_columns(variant_study.parse_args([]))]
    assert cost_keys("--tasks", "cost") == default and "lra_listops" not in default
    assert cost_keys("--tasks", "mqar_w64", "cost") == ["mqar_w64"]


def test_additive_attention_is_not_probed_beyond_the_length_its_step_affords(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(variant_study, "run_in_process", lambda *a: pytest.fail("probed additive at n=784"))
    args = variant_study.parse_args(["--runs-dir", str(tmp_path), "--fashion-mnist", str(tmp_path)])
    pixel = next(task for task in variant_study.tasks(args) if task.key == "lra_pixel")
    pixel = variant_study.Task(**{**pixel.__dict__, "needs": ()})  # its data is not needed to refuse
    additive = next(row for row in variant_study.discover_rows()[0] if row.name == "additive")
    result = variant_study.probe_cost(pixel, additive, args)
    assert result["status"] == "error" and result["reason"].startswith("not measured beyond n=256: additive")


def test_a_real_cost_probe_runs_all_its_steps_even_where_an_epoch_is_shorter(tmp_path: Path) -> None:
    args = variant_study.parse_args(["--quick", "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"),
                                     "--threads", "1"])  # fmt: skip
    row = next(row for row in variant_study.discover_rows()[0] if row.name == "full")
    numbers = next(task for task in variant_study.tasks(args) if task.key == "translation_numbers")
    # --quick's numbers task: 600 pairs, fewer batches an epoch than the probe's steps, and one epoch
    numbers = variant_study.Task(
        **{**numbers.__dict__, "overrides": variant_study.replaced(numbers.overrides, "data.num_train=200")}
    )
    result = variant_study.probe_cost(numbers, row, args)
    assert result["status"] == "ok", result
    assert result["steps"] == variant_study.COST_STEPS - 3 and result["batch_size"] > 1
    assert result["step_ms"] > 0 and result["peak_mib"] > 1
