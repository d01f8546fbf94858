"""Data parallelism: trainer=ddp_cpu (2 gloo processes) keeps the replicas identical, matches one process on
the same global batch, and makes one run directory; torchrun/srun launches share one; GPU strategies on GPUs.

How the runs are made comparable: the single-process reference also runs under DDPStrategy (one process),
so both draw batches from Lightning's DistributedSampler with the same seed. That sampler deals one
permutation round-robin, so ranks 0 and 1 with batch b together hold exactly the reference's batch 2b.
Augmentation and dropout are off; the loss of the global batch is the mean of the ranks' losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import compose_config, run_cli
from zoo.app.launch import external_launch_overrides, launch_info
from zoo.nn.blocks import TransformerBlock
from zoo.training.distributed import ddp_strategy, fsdp_strategy, weights_digest

REPLICA_CHECK = "+callbacks.replica_check._target_=zoo.training.distributed.ReplicaCheck"
TRAIN_ONLY = [
    "trainer.max_steps=4", "trainer.limit_val_batches=0", "test=false", "callbacks=none", "logger=none",
    REPLICA_CHECK,
]  # fmt: skip
# fp32 and no randomness (dropout, MixUp): the parity checks compare one process with DDP to 1e-5
TINY_VIT = ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
            "data.augment=false", "model.net.dropout=0", "model.net.drop_path=0", "model.mixup_alpha=0",
            "model.scheduler.name=constant", "trainer.precision=32-true"]  # fmt: skip
TINY_GPT = ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
            "model.scheduler.warmup_steps=0", "trainer.val_check_interval=null"]  # fmt: skip

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
requires_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def replica_check(run_dir: Path) -> dict:
    return json.loads((run_dir / "replica_check.json").read_text())


def only_run_dir(log_dir: Path, task: str) -> Path:
    runs = [p for p in (log_dir / task).iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run directory, found {runs}"
    return runs[0]


# -- launches by torchrun / srun ------------------------------------------------------------------
def test_torchrun_processes_share_one_run_directory_and_only_rank_zero_writes_the_config() -> None:
    env = {"TORCHELASTIC_RUN_ID": "gpt-01", "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}
    assert launch_info(env) == (0, 8, "torchrun-gpt-01")
    assert external_launch_overrides(["model=gpt"], env) == [
        "hydra.run.dir=${paths.log_dir}/${task_name}/torchrun-gpt-01"
    ]
    assert external_launch_overrides(["model=gpt"], {**env, "RANK": "5"}) == [
        "hydra.run.dir=${paths.log_dir}/${task_name}/torchrun-gpt-01", "hydra.output_subdir=null",
        "hydra.job.name=rank5",
    ]  # fmt: skip
    # A given run directory is kept; torchrun's default rendezvous id "none" names nothing.
    assert external_launch_overrides(["hydra.run.dir=out/x"], {**env, "RANK": "1"})[0] == "hydra.output_subdir=null"
    assert external_launch_overrides([], {**env, "TORCHELASTIC_RUN_ID": "none"}) == []


def test_srun_tasks_share_one_run_directory() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "81234", "SLURM_STEP_ID": "0"}
    assert launch_info(env) == (3, 4, "slurm-81234.0")
    overrides = external_launch_overrides(["model=vit"], env)
    assert overrides[0] == "hydra.run.dir=${paths.log_dir}/${task_name}/slurm-81234.0"
    assert "hydra.output_subdir=null" in overrides


def test_plain_runs_and_sweeps_are_left_alone() -> None:
    assert external_launch_overrides(["model=vit"], {}) == []
    assert external_launch_overrides(["model=vit"], {"LOCAL_RANK": "1"}) == []  # Lightning's own children
    assert external_launch_overrides(["model=vit"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == []
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"}
    assert external_launch_overrides(["-m", "attention=full,local"], env) == []


# -- strategies -------------------------------------------------------------------------------------
def test_trainer_configs_choose_their_strategy(tmp_path: Path) -> None:
    ddp_cpu = compose_config(["trainer=ddp_cpu"], tmp_path).trainer
    assert (ddp_cpu.accelerator, ddp_cpu.devices, ddp_cpu.strategy.process_group_backend) == ("cpu", 2, "gloo")
    gpu = compose_config(["trainer=gpu"], tmp_path).trainer
    assert (gpu.accelerator, gpu.devices, gpu.precision) == ("gpu", 1, "auto")  # bf16-mixed, or 16-mixed before Ampere
    multinode = compose_config(["trainer=multinode"], tmp_path).trainer
    assert multinode.num_nodes == 2 and multinode.strategy._target_.endswith("ddp_strategy")
    assert compose_config(["trainer=cpu"], tmp_path).trainer.accelerator == "cpu"  # still the default
    assert compose_config([], tmp_path).trainer.accelerator == "cpu"


def test_fsdp_strategy_wraps_transformer_blocks() -> None:
    strategy = fsdp_strategy(
        wrap=["zoo.nn.blocks.TransformerBlock"], activation_checkpointing=["zoo.nn.blocks.TransformerBlock"],
        sharding_strategy="SHARD_GRAD_OP", state_dict_type="full",
    )  # fmt: skip
    assert type(strategy).__name__ == "FSDPStrategy"
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {TransformerBlock}
    assert strategy._activation_checkpointing_kwargs  # the blocks are recomputed in backward
    assert strategy.sharding_strategy.name == "SHARD_GRAD_OP" and strategy._state_dict_type == "full"


def test_weights_digest_sees_a_one_ulp_change() -> None:
    module = torch.nn.Linear(3, 2)
    before = weights_digest(module)
    assert weights_digest(module) == before
    with torch.no_grad():
        module.weight[0, 0] = torch.nextafter(module.weight[0, 0], torch.tensor(1e9))
    assert weights_digest(module) != before


# -- trainer=ddp_cpu end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def vit_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-process DDP ViT run (batch 16 per rank) and its one-process reference (batch 32)."""
    root = tmp_path_factory.mktemp("vit_ddp")
    ddp = run_cli([*TINY_VIT, *TRAIN_ONLY, "trainer=ddp_cpu", "data.batch_size=16", "model.optimizer.lr=1e-2",
                   f"paths.log_dir={root / 'ddp'}"])  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = run_cli([*TINY_VIT, *TRAIN_ONLY, "trainer=ddp_cpu", "trainer.devices=1", "data.batch_size=32",
                   "model.optimizer.lr=1e-2", "print_config=false", f"paths.log_dir={root / 'one'}"])  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    return {"ddp": ddp, "ddp_dir": only_run_dir(root / "ddp", "vit"), "one_dir": only_run_dir(root / "one", "vit")}


def test_ddp_vit_makes_one_run_directory_written_and_printed_by_rank_zero(vit_runs: dict) -> None:
    run_dir = vit_runs["ddp_dir"]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "train_ddp_process_1.log").is_file()  # rank 1 ran, and logged into rank 0's directory
    printed = vit_runs["ddp"].stdout.splitlines()
    assert printed.count("config") == 1, "the config tree must be printed by rank 0 only"


def test_ddp_vit_replicas_end_identical_and_match_one_process_on_the_global_batch(vit_runs: dict) -> None:
    ddp, one = replica_check(vit_runs["ddp_dir"]), replica_check(vit_runs["one_dir"])
    assert ddp["world_size"] == 2 and one["world_size"] == 1
    assert len(ddp["weight_digests"]) == 2 and ddp["replicas_identical"]
    assert len(ddp["losses"]) == len(one["losses"]) == 4
    assert max(abs(a - b) for a, b in zip(ddp["losses"], one["losses"])) < 1e-5
    assert abs(one["losses"][-1] - one["losses"][0]) > 1e-3  # it trained: equal losses are not a frozen model


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-job sweep of 2-process DDP GPTs (batch 4 per rank) and the one-process reference of job 0 (batch 8)."""
    root = tmp_path_factory.mktemp("gpt_ddp")
    common = [*TINY_GPT, *TRAIN_ONLY, "trainer=ddp_cpu", "print_config=false", f"paths.data_dir={root / 'data'}"]
    sweep = run_cli(
        [
            "-m",
            *common,
            "data.batch_size=4",
            "model.optimizer.lr=1e-2,2e-2",
            "optimized_metric=null",
            f"paths.log_dir={root / 'ddp'}",
        ]
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    one = run_cli([*common, "trainer.devices=1", "data.batch_size=8", "model.optimizer.lr=1e-2",
                   f"paths.log_dir={root / 'one'}"])  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    (sweep_dir,) = (root / "ddp" / "gpt" / "multirun").iterdir()
    return {"sweep_dir": sweep_dir, "one_dir": only_run_dir(root / "one", "gpt")}


def test_ddp_jobs_of_a_sweep_each_train_in_their_own_directory_with_identical_replicas(gpt_runs: dict) -> None:
    sweep_dir = gpt_runs["sweep_dir"]
    for job in ("0", "1"):
        check = replica_check(sweep_dir / job)
        assert check["world_size"] == 2 and check["replicas_identical"] and len(check["losses"]) == 4
        assert (sweep_dir / job / "train_ddp_process_1.log").is_file()
    summary = (sweep_dir / "summary.csv").read_text()
    assert summary.count("completed") == 2


def test_ddp_gpt_matches_one_process_on_the_global_batch(gpt_runs: dict) -> None:
    ddp, one = replica_check(gpt_runs["sweep_dir"] / "0"), replica_check(gpt_runs["one_dir"])
    assert max(abs(a - b) for a, b in zip(ddp["losses"], one["losses"])) < 1e-5


# -- GPUs (skipped without them) ------------------------------------------------------------------------
@requires_gpu
@pytest.mark.parametrize("overrides", [["trainer=gpu"], ["trainer=gpu", "model.compile=true"]], ids=["bf16", "compile"])
def test_one_gpu_trains_in_bf16(overrides: list[str], tmp_outputs: Path) -> None:
    result = run_cli([*TINY_GPT, *overrides, "trainer.max_steps=20", "trainer.val_check_interval=10",
                      "trainer.limit_val_batches=2", f"paths.log_dir={tmp_outputs}"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((only_run_dir(tmp_outputs, "gpt") / "metrics.json").read_text())
    assert metrics["val/loss"] < 5.0


@requires_two_gpus
@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_two_gpus_keep_replicas_identical_and_test_the_checkpoint(trainer: str, tmp_outputs: Path) -> None:
    result = run_cli([*TINY_VIT, f"trainer={trainer}", "trainer.devices=2", "trainer.max_epochs=1",
                      "trainer.limit_train_batches=4", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
                      f"paths.log_dir={tmp_outputs}", *([REPLICA_CHECK] if trainer == "ddp" else [])])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_outputs, "vit")
    assert "test/acc" in json.loads((run_dir / "metrics.json").read_text())
    if trainer == "ddp":
        assert replica_check(run_dir)["replicas_identical"]


def test_the_strategies_with_a_start_timeout_pickle_as_lightnings_do() -> None:
    """start_method=spawn pickles the trainer and its strategy: a strategy class made per call would not pickle."""
    import pickle

    strategy = pickle.loads(pickle.dumps(ddp_strategy(start_method="spawn", start_timeout=30)))
    assert strategy._timeout.total_seconds() == 30 and type(strategy).__name__ == "DDPStrategy"
    assert pickle.loads(pickle.dumps(fsdp_strategy(start_timeout=30)))._timeout.total_seconds() == 30
