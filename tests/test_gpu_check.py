"""experiments/gpu_check.py on the CPU: everything that does not need CUDA (the comparison loop over the registry's
variants, GPT MFU through the Throughput callback, the skip logic, the time budget, the report writer), and the
committed page saying it has not run until a GPU ran it."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from tests.helpers import ROOT
from zoo.attention import registry

sys.path.insert(0, str(ROOT / "experiments"))
import gpu_check  # noqa: E402


def test_the_cases_are_every_registered_variant_with_each_example_and_the_biases() -> None:
    cases = gpu_check.variant_cases()
    assert {variant for variant, _, _ in cases} == set(registry.VARIANTS)
    for name, kernel in registry.VARIANTS.items():
        for options in kernel.example_options:
            assert (name, {"variant": name, **options}, False) in cases
        biased = {settings.get("position_bias") for variant, settings, _ in cases if variant == name}
        assert ({"alibi", "t5"} <= biased) == kernel.supports_position_bias


def first_examples() -> list:
    """One case per variant: its first example options, not causal."""
    cases = {}
    for variant, settings, causal in gpu_check.variant_cases():
        if not causal and "position_bias" not in settings:
            cases.setdefault(variant, (variant, settings, causal))
    return list(cases.values())


def test_every_variants_fast_cpu_path_equals_its_reference_in_the_comparison_loop() -> None:
    result = gpu_check.compare_variants("cpu", cases=first_examples(), length=24, dim=16)
    assert result["status"] == "ok", {name: row for name, row in result["cases"].items() if not row["ok"]}
    assert len(result["cases"]) == len(first_examples())


def test_a_difference_is_reported_as_a_failed_case(monkeypatch) -> None:
    step, calls = gpu_check.attention_step, []

    def off_on_the_device(module, x):
        calls.append(1)
        out = step(module, x)
        return [out[0] + 1e-2, *out[1:]] if len(calls) % 2 == 0 else out  # the second call of a case: the device's

    monkeypatch.setattr(gpu_check, "attention_step", off_on_the_device)
    result = gpu_check.compare_variants("cpu", cases=[("full", {"variant": "full"}, True)], length=8, dim=8)
    (row,) = result["cases"].values()
    assert (
        result["status"] == "FAILED" and not row["ok"] and row["max_abs_diff_output"] == pytest.approx(1e-2, rel=1e-4)
    )
    page = gpu_check.render_markdown(
        {"environment": gpu_check.environment("cpu", True, 1.0), "sections": {"variants": result}}
    )
    assert "| full[] causal | NO | 1.0e-02 |" in page
    assert "| FAILED | 0 of 1 cases equal; not: full[] causal |" in page


def test_variant_cases_past_the_sections_time_are_listed_as_not_run() -> None:
    result = gpu_check.compare_variants("cpu", cases=first_examples()[:2], length=8, dim=8, budget_s=-1)
    assert result["status"] == "ok" and all(row["ok"] is None for row in result["cases"].values())
    assert gpu_check.summary("variants", result) == "0 of 2 cases equal; 2 not run (time)"


def test_the_ddp_step_runs_only_with_two_gpus() -> None:
    assert gpu_check.ddp_skip_reason("cuda", 2) is None
    assert gpu_check.ddp_skip_reason("cuda", 1) == "1 GPU visible; the 2-rank DDP step needs 2"
    assert gpu_check.ddp_skip_reason("cpu", 0) == "needs 2 CUDA GPUs (NCCL); this run is on the CPU"
    assert gpu_check.ddp_step("cpu") == {"status": "skipped", "note": gpu_check.ddp_skip_reason("cpu", 0)}


def test_a_section_past_the_budget_is_skipped_and_one_that_raises_fails_alone() -> None:
    def slow(device, quick):
        time.sleep(0.05)
        return {"status": "ok"}

    def broken(device, quick):
        raise RuntimeError("no kernel")

    results = gpu_check.run_sections({"broken": broken, "slow": slow, "later": slow}, "cpu", True, budget=0.01)
    assert results["broken"]["status"] == "FAILED" and results["broken"]["error"] == "RuntimeError: no kernel"
    assert results["slow"]["status"] == "ok"  # started within the budget
    assert results["later"]["status"] == "skipped" and "over the time budget" in results["later"]["note"]


def test_a_quick_cpu_run_reports_gpt_mfu_and_says_what_it_skipped(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the CPU probe of the Throughput callback
    sections = ["flash", "gpt2_small", "bias_speed", "ddp", "bf16_training"]
    code = gpu_check.main(["--device", "cpu", "--quick", "--only", *sections, "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {name: result["status"] for name, result in report["sections"].items()}
    assert statuses == {"flash": "skipped", "gpt2_small": "ok", "bias_speed": "skipped", "ddp": "skipped",
                        "bf16_training": "skipped"}  # fmt: skip
    run = report["sections"]["gpt2_small"]["runs"]["eager"]
    assert run["tokens_per_s"] > 0 and 0 < run["mfu"] < 1 and run["peak_source"] == "a measured matmul on this CPU"
    assert 0.9 < run["counted_over_estimate"] < 1.1  # the counted FLOPs against nanoGPT's 6 N + 12 L T d
    page = (tmp_path / "gpu_check.md").read_text()
    assert "| ALiBi / T5 score_mods vs plain flex | skipped | needs CUDA (FlexAttention score_mods) |" in page
    assert f"{run['tokens_per_s']:,.0f} tokens/s" in page


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the full check runs")
def test_without_a_gpu_the_default_run_says_it_needs_one() -> None:
    with pytest.raises(SystemExit, match="needs a CUDA GPU; none is visible"):
        gpu_check.main([])


def test_the_committed_page_says_it_has_not_run_until_a_gpu_ran_it() -> None:
    record = json.loads((gpu_check.RESULTS / "gpu_check.json").read_text())
    page = (gpu_check.RESULTS / "gpu_check.md").read_text()
    if record.get("status") == "not run":
        assert page == gpu_check.NOT_RUN and "Not run yet" in page
    else:  # a GPU's run: its own report
        assert record["environment"]["device"] == "cuda" and page == gpu_check.render_markdown(record)
