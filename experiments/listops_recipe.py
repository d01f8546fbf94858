"""The search for a ListOps recipe that learns on 2 CPU cores: full attention, short runs, one setting at a time.

    python experiments/listops_recipe.py                 # every candidate of CANDIDATES (tens of minutes)
    python experiments/listops_recipe.py --only len512_lr3e-4_b64

At the variant study's old budget (one epoch of 4800 expressions of up to 2000 tokens, lr 1e-3) every row scored
the class prior: nothing learned. Long Range Arena's own issue #15 reports the same collapse (0.175) and that a
lower learning rate or a larger batch fixes it. LRA's recipe (batch 32, 5000 steps, 1000 warm-up steps, an
inverse-square-root decay, 2000 tokens) costs hours a job here, so each candidate keeps the grammar (LRA's depth 10
and 10 arguments per operator) and changes the budget: a shorter maximum length, a lower learning rate, a larger
batch, more steps. Each candidate is one `python run.py experiment=lra_listops ...` job; the page
(experiments/results/listops_recipe.md) gives its test accuracy beside the test set's class prior and its wall
time, and the variant study takes the winner as its ListOps column (variant_study.LISTOPS_RECIPE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `python experiments/listops_recipe.py`
    sys.path.insert(0, str(ROOT))

from experiments.reproduce import fmt, machine, table  # noqa: E402

COMMON = ("experiment=lra_listops", "attention=full", "trainer.max_epochs=-1", "trainer.limit_val_batches=4",
          "print_config=false", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
          "+trainer.enable_progress_bar=false", "data.num_val=256", "data.num_test=1000")  # fmt: skip
# name -> overrides; each line changes one thing against the one before it where it can.
CANDIDATES = {
    "len256_lr3e-4_b32": ("data.max_length=256", "data.num_train=16000", "data.batch_size=32",
                          "model.optimizer.lr=3e-4", "+model.scheduler.warmup_steps=100", "trainer.max_steps=900",
                          "trainer.val_check_interval=150"),
    "len256_lr1e-3_b64": ("data.max_length=256", "data.num_train=16000", "data.batch_size=64",
                          "model.optimizer.lr=1e-3", "+model.scheduler.warmup_steps=100", "trainer.max_steps=1000",
                          "trainer.val_check_interval=125"),
    "len512_lr3e-4_b64": ("data.max_length=512", "data.num_train=8000", "data.batch_size=64",
                          "model.optimizer.lr=3e-4", "+model.scheduler.warmup_steps=100", "trainer.max_steps=750",
                          "trainer.val_check_interval=125"),
}  # fmt: skip


def prior(overrides: tuple[str, ...]) -> float:
    """The test set's most common answer's share for these data settings (generated, not trained)."""
    from zoo.data.listops import generate_listops

    settings = dict(o.split("=", 1) for o in overrides if o.startswith("data."))
    length = int(settings["data.max_length"])
    train, val, test = int(settings["data.num_train"]), 256, 1000
    answers = Counter(a for _, a in generate_listops(train + val + test, length // 4, length, seed=0)[train + val :])
    return answers.most_common(1)[0][1] / test


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(CANDIDATES), help="only these candidates")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "outputs" / "listops_recipe")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "listops_recipe.json")
    args = parser.parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for name in args.only or list(CANDIDATES):
        folder = args.runs_dir / name
        command = [sys.executable, str(ROOT / "run.py"), *COMMON, *CANDIDATES[name], f"hydra.run.dir={folder}"]
        start = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "recipe.log", "w") as log:
            code = subprocess.call(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        metrics = json.loads((folder / "metrics.json").read_text()) if (folder / "metrics.json").is_file() else {}
        results[name] = {"overrides": list(CANDIDATES[name]), "test_acc": metrics.get("test/acc"),
                         "val_acc": metrics.get("val/acc"), "prior": prior(CANDIDATES[name]), "exit": code,
                         "wall_s": round(wall, 1), "date": datetime.now().strftime("%Y-%m-%d %H:%M"),
                         "machine": machine()["CPU"]}  # fmt: skip
        print(name, results[name], flush=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    rows = [[name, " ".join(r["overrides"]), fmt(r["test_acc"]), fmt(r["prior"]), f"{r['wall_s'] / 60:.1f}",
             r["date"]] for name, r in results.items()]  # fmt: skip
    page = args.out.with_suffix(".md")
    header = ["candidate", "overrides", "test acc", "prior", "wall min", "date"]
    page.write_text("# ListOps recipe search (full attention, seed 0)\n\nWritten by `python experiments/"
                    "listops_recipe.py`. Test accuracy on 1000 generated expressions beside their most common answer's "
                    "share (the class prior).\n\n" + table(header, rows) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
