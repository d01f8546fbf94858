"""experiments/listops_recipe.py: each candidate is one run.py job whose test accuracy is written beside the test
set's class prior, and the variant study's ListOps column takes the chosen candidate's settings."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from experiments import listops_recipe, variant_study
from zoo.data.listops import generate_listops


def test_each_candidate_is_a_job_reported_beside_the_prior(tmp_path: Path, monkeypatch) -> None:
    commands: list[list[str]] = []

    def fake_call(command: list[str], cwd, stdout, stderr) -> int:
        commands.append(command)
        folder = Path(next(a for a in command if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        (folder / "metrics.json").write_text(json.dumps({"test/acc": 0.31, "val/acc": 0.3}))
        return 0

    tiny = ("data.max_length=64", "data.num_train=40", "trainer.max_steps=2")
    monkeypatch.setattr(listops_recipe, "CANDIDATES", {"tiny": tiny})
    monkeypatch.setattr(listops_recipe.subprocess, "call", fake_call)
    out = tmp_path / "recipe.json"
    listops_recipe.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    (command,) = commands
    assert command[-1] == f"hydra.run.dir={tmp_path / 'runs' / 'tiny'}" and all(o in command for o in tiny)
    assert "experiment=lra_listops" in command and "attention=full" in command
    result = json.loads(out.read_text())["tiny"]
    # the prior: the most common answer's share of the 1000 test expressions, drawn after 40 train and 256 val
    answers = Counter(answer for _, answer in generate_listops(40 + 256 + 1000, 16, 64, seed=0)[296:])
    assert result["test_acc"] == 0.31 and result["prior"] == answers.most_common(1)[0][1] / 1000
    assert (
        "| tiny | data.max_length=64 data.num_train=40 trainer.max_steps=2 | 0.310 |"
        in out.with_suffix(".md").read_text()
    )


def test_the_study_takes_the_chosen_candidate() -> None:
    chosen = listops_recipe.CANDIDATES[variant_study.LISTOPS_CHOICE]
    assert all(o in variant_study.LISTOPS_RECIPE for o in chosen if not o.startswith("trainer.val_check_interval"))
