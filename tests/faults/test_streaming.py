"""Mid-epoch resume from shards: a run streaming data=images_stream, killed with SIGKILL in the middle of its first
epoch of three and resumed (auto_resume), trains on every sample of each epoch exactly once, sees in every step of
every later epoch the batches of the uninterrupted run in its order, and ends with the uninterrupted run's
metrics: the StreamingDataLoader's position travels in the checkpoint (Lightning stores its state_dict)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import lightning as L
import pytest

from tests.faults.conftest import assert_same_metrics, fault, metrics_of, only_run_dir, run
from zoo.data.images import DigitsDataModule
from zoo.data.shards import read_meta, write_shards

# 3 epochs of 11 batches (1,365 digits, 128 a batch), last.ckpt every 5 steps: the kill at step 5 is after batch
# 4 of epoch 0, the first, right at a checkpoint, so the resumed run repeats no step; epochs 1 and 2 are wholly
# the resumed process's.
EPOCHS, STEPS_PER_EPOCH, KILL_AT = 3, 11, 5
STREAM_VIT = [
    "model=vit", "data=images_stream", "data.patch_size=2", "data.batch_size=128", "trainer.precision=32-true",
    "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
    f"trainer.max_epochs={EPOCHS}",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
    "trainer.deterministic=true", "+callbacks.last_checkpoint.every_n_train_steps=5",
    "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null", "callbacks.lr_monitor=null",
    "+trainer.enable_progress_bar=false", "print_config=false", "logger=csv",
]  # fmt: skip


class RecordSamples(L.Callback):
    """Appends the sample ids of every training step to `path` (one JSON line, synced: a kill loses none)."""

    def __init__(self, path: str) -> None:
        self.path, self.pending = path, []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule, collate = trainer.datamodule, trainer.datamodule.collate

        def recording(samples: list[dict]) -> object:
            if trainer.training:  # batches are fetched one ahead: the oldest pending one is the step's
                self.pending.append([sample["index"] for sample in samples])
            return collate(samples)

        datamodule.collate = recording

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        line = {"epoch": trainer.current_epoch, "step": trainer.global_step, "ids": self.pending.pop(0)}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def record(path: Path) -> list[str]:
    return [f"+callbacks.record._target_={__name__}.RecordSamples", f"+callbacks.record.path={path}"]


def steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "shards"
    write_shards(DigitsDataModule(val_fraction=0.05, test_fraction=0.2, image_size=8, in_channels=1), out, "16KB")
    return out


# Without randomness in training, the data's position alone decides the run; with dropout, drop path, MixUp and
# the batch augmentation (random crops), the random generators' states must travel in the checkpoint too
# (zoo.training.callbacks.ResumeState) and be restored after the resumed run has rebuilt its loaders.
RANDOMNESS = {
    "deterministic": ["data.augment=false", "model.net.dropout=0", "model.net.drop_path=0", "model.mixup_alpha=0"],
    "dropout_mixup_augment": ["data.augment=true", "model.net.dropout=0.1", "model.net.drop_path=0.1",
                              "model.mixup_alpha=0.4"],
}  # fmt: skip


@pytest.mark.parametrize("randomness", RANDOMNESS)
def test_a_run_killed_mid_epoch_resumes_at_its_sample_and_ends_with_the_uninterrupted_metrics(
    shards: Path, tmp_path: Path, randomness: str
) -> None:
    data = f"data.data_dir={shards}"
    settings = [*STREAM_VIT, *RANDOMNESS[randomness]]
    code, _, err, _ = run([*settings, data, f"paths.log_dir={tmp_path / 'ref'}", *record(tmp_path / "ref.jsonl")])
    assert code == 0, err[-3000:]
    reference = metrics_of(only_run_dir(tmp_path / "ref"))

    killed_log = tmp_path / "killed.jsonl"
    args = [*settings, data, f"paths.log_dir={tmp_path / 'run'}", *record(killed_log)]
    code, _, err, _ = run([*args, *fault("KillAtStep", tmp_path / "fired", step=KILL_AT)])
    assert code == -9, err[-3000:]
    run_dir = only_run_dir(tmp_path / "run")
    assert [s["step"] for s in steps(killed_log)] == list(range(1, KILL_AT + 1))
    code, _, err, _ = run([*args, *fault("KillAtStep", tmp_path / "fired", step=KILL_AT), f"auto_resume={run_dir}"])
    assert code == 0, err[-3000:]

    seen, uninterrupted = steps(killed_log), steps(tmp_path / "ref.jsonl")
    assert [s["step"] for s in seen] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), "goes on at the next step"
    total = read_meta(shards)["splits"]["train"]["items"]
    per_epoch = defaultdict(list)
    for step in seen:
        per_epoch[step["epoch"]] += step["ids"]
    for epoch, ids in per_epoch.items():
        assert sorted(ids) == list(range(total)), f"epoch {epoch}: not every sample exactly once"
    for epoch in range(EPOCHS):  # step by step: the same sample ids in the same order as the uninterrupted run
        assert [s for s in seen if s["epoch"] == epoch] == [s for s in uninterrupted if s["epoch"] == epoch], epoch
    # Epoch means of training metrics (train/acc, train/loss_epoch) average over the steps this process ran: the
    # resumed run's cover the end of the epoch only. Every other metric, weights-dependent, must match exactly.
    resumed = metrics_of(run_dir)
    assert resumed.keys() == reference.keys()
    same = {key for key in reference if key not in ("train/acc", "train/loss_epoch")}
    assert_same_metrics({k: resumed[k] for k in same}, {k: reference[k] for k in same})
