"""experiments/reproduce.py: the runs it plans, what it does without data, and the results page it writes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from experiments import reproduce


def test_quick_plan_covers_every_model_and_variant_and_skips_missing_data(tmp_path: Path) -> None:
    args = reproduce.parse_args(["--quick", "--shared", str(tmp_path / "nowhere"), "--fashion-mnist", str(tmp_path)])
    assert args.seeds == 1 and args.out.name == "quick"  # a quick check never replaces the committed figures
    runs = reproduce.quality_runs(args)
    assert {(r.study, r.variant) for r in runs if r.study in ("gpt", "vit")} >= {
        (study, variant) for study in ("gpt", "vit") for variant in reproduce.VARIANTS
    }
    assert {r.study for r in runs} == {"gpt", "vit", "translation", "clip"}
    gpt = next(r for r in runs if r.study == "gpt")
    assert "trainer.max_steps=300" in gpt.overrides
    result = reproduce.run_quality(gpt, tmp_path / "runs", reuse=False)
    assert result["status"].startswith("skipped") and "nowhere" in result["status"]
    # A Fashion-MNIST folder that exists but holds no idx files is missing data too (no download attempt).
    clip = next(r for r in runs if r.study == "clip")
    result = reproduce.run_quality(clip, tmp_path / "runs", reuse=False)
    assert result["status"].startswith("skipped") and "train-images-idx3-ubyte" in result["status"]
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_results_can_be_written_outside_the_repository(tmp_path: Path, capsys) -> None:
    out = tmp_path / "elsewhere"
    reproduce.main(["--quick", "--only", "gpt", "--shared", str(tmp_path / "nowhere"), "--out", str(out)])
    text = (out / "RESULTS.md").read_text()
    assert "skipped" in text and str(tmp_path / "nowhere") in text
    assert f"wrote {out / 'RESULTS.md'}" in capsys.readouterr().out


def test_training_runs_go_to_the_folder_given_with_runs(tmp_path: Path) -> None:
    assert reproduce.parse_args([]).runs == reproduce.ROOT / "outputs" / "reproduce"
    args = reproduce.parse_args(["--quick", "--runs", str(tmp_path / "runs"), "--only", "attention", "--out",
                                 str(tmp_path / "out")])  # fmt: skip
    assert args.runs == tmp_path / "runs"


def test_reuse_reads_a_finished_run_without_running_it(tmp_path: Path) -> None:
    run = reproduce.Run("vit", "vit_digits-full-seed0", "ViT, digits (test accuracy)", "full", [], "test/acc")
    (tmp_path / run.name).mkdir()
    (tmp_path / run.name / "metrics.json").write_text(json.dumps({"test/acc": 0.97}))
    result = reproduce.run_quality(run, tmp_path, reuse=True)
    assert result["status"] == "ok" and result["value"] == 0.97


def test_results_page_has_machine_headline_medians_and_plots(tmp_path: Path) -> None:
    args = reproduce.parse_args(["--out", str(tmp_path)])
    runs, results = [], {}
    for variant, values in (("full", [0.95, 0.97, 0.96]), ("rope", [0.98, 0.99, 0.97])):
        for seed, value in enumerate(values):
            run = reproduce.Run("vit", f"v-{variant}-{seed}", "ViT, digits (test accuracy)", variant, [], "test/acc",
                                "SVC 0.969")  # fmt: skip
            runs.append(run)
            results[run.name] = {"status": "ok", "value": value, "wall_s": 60.0, "date": "2026-12-01"}
    missing = reproduce.Run("translation", "t", "Transformer, Multi30k", "full", [], "test/bleu")
    runs.append(missing)
    results["t"] = {"status": "skipped: /x not found"}
    summary = reproduce.summarise_quality(runs, results)
    reproduce.plot_quality(summary, tmp_path / "quality.png")
    gpt = {"tokens_per_s": {"zoo GPT, plain loop, 32-true": [100.0, 110.0],
                            "zoo GPT, Lightning, 32-true": [99.0, 108.0],
                            "HF GPT-2, plain loop, 32-true": [80.0, 82.0]},
           "ratios": {"Lightning / plain loop, fp32": 0.986, "Lightning bf16-mixed / Lightning fp32": 1.31,
                      "zoo Lightning (fastest) / zoo Lightning fp32 eager": 1.5},
           "peak_flops": 1e11, "flops_per_token": 1e6, "threads": 2,
           "args": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "rounds": 2,
                    "steps": 20}}  # fmt: skip
    speed = reproduce.speed_markdown(gpt, None, None, tmp_path)
    (tmp_path / reproduce.KV_MEMORY).write_text("# KV-cache memory\n\n| kv_heads | bytes per token |\n| 1 | 8 |\n")
    path = reproduce.write_results(args, {"CPU": "test CPU", "cores": "2"}, summary, ("", []), speed, tmp_path)
    text = path.read_text()
    assert "| CPU | test CPU |" in text
    assert "| ViT, digits (test accuracy) | rope | 0.980 (0.970-0.990) | 3 |" in text  # median and range of 3 seeds
    assert "| ViT, digits (test accuracy) (rope attention) | 0.980 | SVC 0.969 |" in text  # the best variant leads
    assert "skipped: /x not found" in text
    assert "Lightning / plain loop, fp32 **0.986x** (target >= 0.97)" in text
    assert "| GPT training tokens/s, Lightning bf16-mixed / Lightning fp32 | 1.310x | - |" in text  # eager vs eager
    assert "Lightning bf16-mixed / Lightning fp32 **1.310x**;" in text  # no target: #19's is on the fastest path
    assert "| GPT training tokens/s, zoo Lightning (fastest) / zoo Lightning fp32 eager | 1.500x | >= 1.2x |" in text
    assert "### KV-cache memory per token, grouped-query heads (`experiments/kv_cache_memory.py`)\n\n| kv_heads" in text
    assert (tmp_path / "quality.png").stat().st_size > 1000 and (tmp_path / "gpt_throughput.png").is_file()


STUDY_PAGE = """Written by `python experiments/variant_study.py --tasks gpt_char vit_digits` (full) in 9.0 min.

| date | 2026-12-01 16:10 |

| attention | ViT digits (test acc) | GPT tiny-shakespeare char (val loss) | GPT val loss at 4x the block |
|---|---|---|---|
| full | 0.980 | 1.9102 | [1] |
| local | 0.975 | 1.9500 | [2] |
| full+alibi | 0.981 | 1.8425 | 1.8231 |

[1] wpe.weight is (64, 128) for block 64: no weights for the longer input
[2] a note only the local row cites

## Step time and peak memory at each task's length

| attention | GPT tiny-shakespeare char (val loss) |
|---|---|
| full | [1] |

[1] a note of another table, numbered from [1] again
"""


def test_positions_section_takes_the_gpt_columns_of_the_position_rows(tmp_path: Path) -> None:
    assert reproduce.positions_markdown(tmp_path) == ""  # no study page: no section
    (tmp_path / reproduce.POSITIONS).mkdir()
    (tmp_path / reproduce.POSITIONS / "variant_study.md").write_text(STUDY_PAGE)
    text = reproduce.positions_markdown(tmp_path)
    assert "| attention | GPT tiny-shakespeare char (val loss) | GPT val loss at 4x the block |" in text
    assert "| full+alibi | 1.8425 | 1.8231 |" in text and "| full | 1.9102 | [1] |" in text
    assert "local" not in text.split("|---|")[1] and "0.980" not in text  # other rows and columns left out
    assert "[2]" not in text  # the footnotes of rows left out stay out
    assert "another table" not in text  # nor those of another table that reuse a number
    assert "[1] wpe.weight" in text and "--tasks gpt_char vit_digits" in text and "2026-12-01 16:10" in text
    assert f"({reproduce.POSITIONS}/variant_study.md)" in text
    assert "stretch the `rope` row's weights by 4 at inference" in text and "train and evaluate" not in text
    # The full study's page, once it has the 4x column, is preferred.
    (tmp_path / "variant_study.md").write_text(STUDY_PAGE.replace("1.8231", "1.7000"))
    assert "| full+alibi | 1.8425 | 1.7000 |" in reproduce.positions_markdown(tmp_path)


def test_the_headline_holds_every_kernel_target_at_each_thread_count(tmp_path) -> None:
    """#17's targets: forward and forward+backward, at 1 thread (the main run) and at 2 (its own folder)."""
    fields = ["device", "length", "variant", "forward_ms", "train_ms", "forward_vs_sdpa", "train_vs_sdpa",
              "forward_speedup_vs_full", "train_peak_mib"]  # fmt: skip

    def write(folder, local_train_ratio: float, threads: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "attention_benchmark.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for variant, forward, train in (("sdpa", 1.0, 1.0), ("local-kernel", 0.1, local_train_ratio)):
                writer.writerow({"device": "cpu", "length": 8192, "variant": variant, "forward_ms": 1,
                                 "train_ms": 1, "forward_vs_sdpa": forward, "train_vs_sdpa": train,
                                 "forward_speedup_vs_full": 1, "train_peak_mib": 1})  # fmt: skip
        (folder / "attention_benchmark.md").write_text(f"| torch threads | {threads} |\n")

    write(tmp_path, 0.1, 1)
    write(tmp_path / reproduce.TWO_THREADS, 0.2, 2)
    _, headline = reproduce.attention_markdown(tmp_path)
    assert "| local attention kernel speed-up vs causal SDPA at n=8192 (forward, 1 thread) | 10.00x | >= 10x |" in (
        headline
    )
    assert (
        "| local attention kernel speed-up vs causal SDPA at n=8192 (forward+backward, 2 threads) | 5.00x | >= 8x |"
        in headline
    )


def test_rewriting_the_page_keeps_the_sections_other_scripts_wrote(tmp_path: Path) -> None:
    """A section another script wrote (faithfulness.py's) survives a rewrite; a section of this script's is replaced."""
    args = reproduce.parse_args(["--out", str(tmp_path)])
    kept = f"## Faithfulness\n\n{reproduce.OTHER_SCRIPT}: by `experiments/faithfulness.py`.\n\n| a |"
    (tmp_path / "RESULTS.md").write_text(f"# zoo results\n\n## Speed\n\nan old figure\n\n{kept}\n")
    text = reproduce.write_results(args, {"CPU": "c"}, [], ("", []), ("", []), tmp_path).read_text()
    assert text.count(kept) == 1 and "an old figure" not in text
    again = reproduce.write_results(args, {"CPU": "c"}, [], ("", []), ("", []), tmp_path).read_text()
    assert again == text  # rewriting twice neither duplicates nor loses it


def test_the_committed_results_page_has_each_section_once() -> None:
    """experiments/results/RESULTS.md is rewritten section by section across sittings: a section left behind next
    to its newer copy (e.g. the GPT's position options) would show two dates and two sets of figures."""
    text = (Path(__file__).resolve().parents[1] / "experiments" / "results" / "RESULTS.md").read_text()
    titles = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith(("## ", "### "))]
    assert len(titles) == len(set(titles)), sorted({title for title in titles if titles.count(title) > 1})
