"""Runs survive faults: exact resume after SIGKILL, checkpoints on SIGTERM / Ctrl-C, atomic and safe
checkpoint files, a stop on a non-finite loss, separate run directories, no secrets in saved files."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

import zoo.training.checkpoints
from tests.helpers import compose_config, finish, start
from zoo.app.cli import RunFolders, prepare_arguments
from zoo.app.pipeline import prepare_checkpoint, with_safety_net
from zoo.app.secrets import redact
from zoo.errors import CheckpointError, NonFiniteLossError, UsageError
from zoo.training.callbacks import collect_rng_state, restore_rng_state
from zoo.training.checkpoints import AtomicCheckpointIO, check_task, check_weights
from zoo.training.throughput import MEASURED
from zoo.weights import read_checkpoint as load_checkpoint


# -- a tiny task to drive Lightning's loops -----------------------------------------------------------
class Regression(L.LightningModule):
    """y = x @ w; `nan_at_step` makes the loss NaN at that optimiser step; `on_step` runs a hook per step."""

    def __init__(self, nan_at_step: int | None = None, on_step=None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.nan_at_step = nan_at_step
        self.on_step = on_step

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.on_step is not None:
            self.on_step(self.trainer)
        if self.trainer.global_step == self.nan_at_step:
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)


def trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", filename="last", every_n_train_steps=1)
    options = dict(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=with_safety_net([checkpoints]), plugins=[AtomicCheckpointIO()], default_root_dir=tmp_path,
    )  # fmt: skip
    return L.Trainer(**{**options, **kwargs})


# -- atomic, safe checkpoint files ---------------------------------------------------------------------
def test_atomic_save_keeps_the_previous_checkpoint_when_a_save_dies_midway(tmp_path: Path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def dies_midway(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(zoo.training.checkpoints.torch, "save", dies_midway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["state_dict"]["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left behind


def test_atomic_save_removes_temporaries_left_by_a_killed_process(tmp_path: Path) -> None:
    stale = tmp_path / ".last.ckpt.12345.tmp"
    stale.write_bytes(b"partial")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, tmp_path / "last.ckpt")
    assert not stale.exists()
    assert load_checkpoint(tmp_path / "last.ckpt")["state_dict"] == {}


class PlantedCode:
    """Unpickling this calls os.mkdir(marker): what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_malicious_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "code_ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"payload": PlantedCode(marker)}}, evil)
    with pytest.raises(CheckpointError, match=r"refused.*posix\.mkdir|refused.*os\.mkdir"):
        load_checkpoint(evil)
    with pytest.raises(Exception, match="mkdir"):  # Lightning's own load path goes through the same guard
        AtomicCheckpointIO().load_checkpoint(evil, weights_only=False)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the plant is real: an unsafe load runs it
    assert marker.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is not a file"),
        (b"", "is empty"),
        (b"not a checkpoint at all " * 4, "truncated or corrupt"),
        ("truncated", "truncated or corrupt"),
        ("tensor", "not a Lightning checkpoint"),
    ],
)
def test_unusable_checkpoint_files_get_one_clear_line(tmp_path: Path, content, message: str) -> None:
    path = tmp_path / "model.ckpt"
    if content == "truncated":
        torch.save({"state_dict": {"w": torch.randn(1000)}}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif content == "tensor":
        torch.save(torch.ones(2), path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as error:
        load_checkpoint(path)
    assert "\n" not in str(error.value) and "model.ckpt" in str(error.value)


def test_checkpoint_of_another_family_is_refused_by_metadata_and_by_hyperparameters() -> None:
    vit = "zoo.tasks.classification.ImageClassificationTask"
    gpt = {"zoo": {"task": "zoo.tasks.language_model.LanguageModelTask", "model": "gpt"}, "state_dict": {}}
    with pytest.raises(CheckpointError, match=r"written by LanguageModelTask \(model=gpt\).*model=gpt"):
        check_task(gpt, vit, "gpt.ckpt", "vit")
    check_task(gpt, gpt["zoo"]["task"], "gpt.ckpt", "gpt")  # its own family passes
    unlabeled = {"state_dict": {}, "hyper_parameters": {"net": {}, "sample": {"prompt": "x"}}}
    with pytest.raises(CheckpointError, match=r"another model family.*'sample'"):
        check_task(unlabeled, vit, "old.ckpt")


def test_checkpoint_with_other_shapes_names_the_first_mismatch() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(4, 8))
    reshaped = {"state_dict": {"0.weight": torch.zeros(16, 4), "0.bias": torch.zeros(16)}}
    with pytest.raises(CheckpointError, match=r"0\.weight is \(16, 4\) in the checkpoint but \(8, 4\) here"):
        check_weights(reshaped, module, "x.ckpt")
    with pytest.raises(CheckpointError, match="2 of its 2 weights are missing"):
        check_weights({"state_dict": {"other.weight": torch.zeros(1)}}, module, "x.ckpt")
    check_weights({"state_dict": module.state_dict()}, module, "x.ckpt")


# -- generator states ----------------------------------------------------------------------------------
def test_rng_state_survives_a_weights_only_checkpoint_and_replays_every_generator(tmp_path: Path) -> None:
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save({"rng": collect_rng_state()}, tmp_path / "rng.pt")
    first = (torch.rand(3), np.random.rand(3), random.random(), np.random.randn())
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random(), np.random.randn())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2:] == again[2:]


# -- non-finite loss -----------------------------------------------------------------------------------
def test_nan_loss_stops_before_the_update_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    model = Regression(nan_at_step=3)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 3 \(epoch 0, batch 4\)") as error:
        trainer(tmp_path).fit(model)
    assert "last good checkpoint is kept" in str(error.value) and "last.ckpt" in str(error.value)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the NaN never reached the weights
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
    assert saved["zoo"]["task"].endswith("Regression")


# -- SIGTERM / Ctrl-C ----------------------------------------------------------------------------------
def signal_at_step(signum: int, step: int):
    def send(trainer: L.Trainer) -> None:
        if trainer.global_step == step:
            os.kill(os.getpid(), signum)

    return send


@pytest.fixture
def ctrl_c_live():
    """A background job (`pytest ... &` in a script) starts with Ctrl-C ignored: make SIGINT interrupt again."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_interrupt_saves_a_checkpoint_after_the_current_batch_and_resume_completes(
    tmp_path: Path, signum: int, capsys, ctrl_c_live
) -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def interrupted_fit(fit: L.Trainer) -> None:
        try:
            with pytest.raises((SIGTERMException, SystemExit)):
                fit.fit(Regression(on_step=signal_at_step(signum, 3)))
        finally:  # Lightning ignores SIGINT while it shuts down after a Ctrl-C: give it back
            if signum == signal.SIGINT:
                signal.signal(signal.SIGINT, handlers[signal.SIGINT])

    interrupted_fit(trainer(tmp_path, callbacks=with_safety_net([]), enable_checkpointing=False))
    assert "no ModelCheckpoint, nothing saved" in capsys.readouterr().err
    interrupted_fit(trainer(tmp_path))
    assert signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]
    path = tmp_path / "checkpoints" / "last.ckpt"
    reason = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    assert f"interrupted by {reason} at step 4: saved {path}" in capsys.readouterr().err
    assert load_checkpoint(path)["global_step"] == 4  # the batch in flight finished; nothing half-done

    resumed = trainer(tmp_path)
    resumed.fit(Regression(), ckpt_path=path, weights_only=True)
    assert resumed.global_step == 16 and resumed.current_epoch == 2


# -- run directories and resume planning --------------------------------------------------------------
def test_runs_started_in_the_same_second_claim_different_directories(tmp_path: Path) -> None:
    base = str(tmp_path / "vit" / "2030-01-01_12-00-00")
    folders = RunFolders()
    claimed = [folders.claim(base) for _ in range(3)]
    assert claimed == [base, f"{base}_1", f"{base}_2"] and all(Path(p).is_dir() for p in claimed)
    hydra = OmegaConf.to_container(compose_config(["model=vit"]).hydra, resolve=False)
    assert hydra["run"]["dir"].startswith("${fresh_dir:") and hydra["sweep"]["dir"].startswith("${fresh_dir:")


def make_run_dir(tmp_path: Path, overrides: list[str]) -> Path:
    run_dir = tmp_path / "vit" / "2030-01-01_12-00-00"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return run_dir


def test_auto_resume_continues_in_the_run_directory_with_its_own_overrides(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, ["model.net.dim=16", "trainer.max_epochs=5", "seed=7"])
    args = prepare_arguments([f"auto_resume={run_dir}", "trainer.max_epochs=9"], RunFolders())
    assert args[:3] == ["model.net.dim=16", "seed=7", "auto_resume=true"]
    assert "trainer.max_epochs=9" in args and "trainer.max_epochs=5" not in args  # yours win
    assert f"hydra.run.dir={run_dir.resolve()}" in args
    assert any(a.startswith("hydra.output_subdir=.hydra/resume_") for a in args)  # the original config stays

    from_checkpoint = prepare_arguments([f"ckpt_path={run_dir}/checkpoints/last.ckpt"], RunFolders())
    assert f"hydra.run.dir={run_dir.resolve()}" in from_checkpoint and "seed=7" in from_checkpoint
    evaluation = [f"ckpt_path={run_dir}/checkpoints/last.ckpt", "train=false"]
    assert prepare_arguments(evaluation, RunFolders()) == evaluation  # evaluating is not resuming: a new directory


def test_auto_resume_true_continues_from_last_checkpoint_or_starts_fresh(tmp_path: Path) -> None:
    cfg = compose_config(["model=vit", "auto_resume=true"], tmp_path)
    assert prepare_checkpoint(cfg) is None  # a first start: nothing to continue
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    torch.save({"state_dict": {}, "zoo": {"task": cfg.model._target_, "model": "vit"}}, last)
    assert prepare_checkpoint(cfg) == str(last)
    cfg.auto_resume, cfg.ckpt_path = False, "last"
    assert prepare_checkpoint(cfg) == str(last)
    last.unlink()
    with pytest.raises(CheckpointError, match="ckpt_path=last but there is no .*last.ckpt"):
        prepare_checkpoint(cfg)


def test_bad_resume_requests_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"auto_resume=.*is not a run directory.*valid"):
        prepare_arguments([f"auto_resume={tmp_path}"], RunFolders())
    run_dir = make_run_dir(tmp_path, [])
    with pytest.raises(UsageError, match="cannot be combined with -m"):
        prepare_arguments(["-m", f"auto_resume={run_dir}"], RunFolders())
    with pytest.raises(UsageError, match=r"unknown model 'gtp'; valid choices: .*gpt.*vit"):
        prepare_arguments(["-m", "model=vit,gtp"], RunFolders())
    assert prepare_arguments(["model=vit", "~logger", "hydra/launcher=basic"], RunFolders()) == [
        "model=vit", "~logger", "hydra/launcher=basic",
    ]  # fmt: skip


# -- secrets -------------------------------------------------------------------------------------------
def test_secrets_from_the_environment_are_redacted(monkeypatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-0123456789")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a name with TOKEN, but no secret
    assert redact("key: wandb-secret-0123456789, parallel: false") == "key: ***, parallel: false"


# -- end to end: real processes ------------------------------------------------------------------------
TINY_VIT = [
    "model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
    "trainer.max_epochs=4", "+trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2", "trainer.deterministic=true", "logger=csv", "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null", "callbacks.lr_monitor=null", "+trainer.enable_progress_bar=false",
    "print_config=false",
]  # fmt: skip


def wait_for(pattern: str, root: Path, process: subprocess.Popen, timeout: float = 180) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
        assert process.poll() is None, finish(process)[2][-3000:]
        time.sleep(0.02)
    raise TimeoutError(f"{pattern} did not appear under {root}")


# A GPT trains on an endless stream of random blocks: resuming must continue that stream, not restart it.
TINY_GPT = [
    "model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
    "data.batch_size=4", "data.eval_batches=2", "model.scheduler.warmup_steps=4", "trainer.max_steps=40",
    "trainer.val_check_interval=5", "trainer.limit_test_batches=2", "model.sample.max_new_tokens=64",
    *TINY_VIT[TINY_VIT.index("trainer.deterministic=true") :],
]  # fmt: skip


@pytest.mark.parametrize("family, args, metric", [("vit", TINY_VIT, "test/acc"), ("gpt", TINY_GPT, "test/loss")])
def test_run_killed_with_sigkill_resumes_to_exactly_the_uninterrupted_metrics(
    family: str, args: list[str], metric: str, tmp_path: Path
) -> None:
    reference = start([*args, f"paths.log_dir={tmp_path / 'reference'}"])
    victim = start([*args, f"paths.log_dir={tmp_path / 'killed'}"])
    checkpoint = wait_for(f"{family}/*/checkpoints/last.ckpt", tmp_path / "killed", victim)
    while load_checkpoint(checkpoint)["global_step"] < 10:  # a quarter or half of the run done: kill it
        assert victim.poll() is None, finish(victim)[2][-3000:]
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    assert finish(victim)[0] == -signal.SIGKILL
    run_dir = checkpoint.parent.parent
    assert not (run_dir / "metrics.json").exists()  # it really died before the end

    code, _, err = finish(start([f"auto_resume={run_dir}"]))
    assert code == 0, err[-3000:]
    code, _, err = finish(reference)
    assert code == 0, err[-3000:]
    expected = json.loads(next((tmp_path / "reference").glob(f"{family}/*/metrics.json")).read_text())
    resumed = json.loads((run_dir / "metrics.json").read_text())
    assert resumed.keys() == expected.keys() and metric in resumed
    for key, value in expected.items():
        if key not in MEASURED:  # speeds are measurements of the machine, not of the run
            assert resumed[key] == pytest.approx(value, abs=1e-6), key
    assert [p.name for p in (tmp_path / "killed" / family).iterdir()] == [run_dir.name]  # no second directory
    original = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "auto_resume" not in original and args[1] in original  # the original record stays


def test_sigterm_saves_last_checkpoint_and_exits_143(tmp_path: Path) -> None:
    process = start([*TINY_VIT, "trainer.max_epochs=50", f"paths.log_dir={tmp_path}"])
    checkpoint = wait_for("vit/*/checkpoints/last.ckpt", tmp_path, process)
    before = load_checkpoint(checkpoint)["global_step"]
    process.send_signal(signal.SIGTERM)
    code, _, err = finish(process)
    assert code == 143, err[-3000:]
    assert "interrupted by SIGTERM at step" in err and f"ckpt_path={checkpoint}" in err
    saved = load_checkpoint(checkpoint)
    assert saved["global_step"] >= before and "rng" in saved["callbacks"]["ResumeState"]


def test_runs_started_together_get_own_directories_and_no_secret_reaches_any_file(tmp_path: Path) -> None:
    secret = "wandb-0123456789abcdef-secret"
    env = {"WANDB_API_KEY": secret, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    args = [
        "model=vit", "trainer.fast_dev_run=true", "logger=[csv,wandb]", f"paths.log_dir={tmp_path}",
        "+api_probe=${oc.env:WANDB_API_KEY}",  # a config value that holds the secret: printed and sent to W&B
    ]  # fmt: skip
    processes = [start(args, env) for _ in range(2)]
    results = [finish(p) for p in processes]
    for code, out, err in results:
        assert code == 0, err[-3000:]
        assert secret not in out + err
    runs = sorted((tmp_path / "vit").iterdir())
    assert len(runs) == 2 and all((run / "metrics.json").is_file() for run in runs)
    assert all(any(run.glob("wandb/offline-run-*")) for run in runs)
    for file in tmp_path.rglob("*"):
        if file.is_file():
            assert secret.encode() not in file.read_bytes(), file
