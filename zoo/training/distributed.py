"""Running one job as many processes: FSDP set up from YAML, a check that replicas stay identical, and one
line for a run whose other processes died or stopped answering.

Lightning does the distributed work (conf/trainer/ddp*.yaml, fsdp.yaml, multinode.yaml); zoo/app/launch.py
makes the processes of a torchrun/srun launch share one run directory.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class


# -- joining the run, then waiting in a collective -------------------------------------------------------
# Two bounds, apart: a rank's start-up (a new interpreter importing torch and Lightning, on a loaded node or a slow
# shared file system) can take minutes, while a rank that hangs mid-training should end the run sooner. Lightning
# hands one `timeout` to init_process_group, where it bounds both; here `start_timeout` bounds the rendezvous and
# `timeout` every collective after it (torch.distributed.set_timeout once the process group is up).
class StartTimeout:
    """Mixed into a Lightning strategy class (DDP, FSDP): takes `start_timeout`, a timedelta or seconds (None: as
    `timeout`). Module-level classes, not made per call, so a strategy pickles (start_method=spawn needs it)."""

    def __init__(self, *args: Any, start_timeout: timedelta | float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collective_timeout = self._timeout
        if isinstance(start_timeout, (int, float)) and not isinstance(start_timeout, bool) and start_timeout > 0:
            start_timeout = timedelta(seconds=start_timeout)
        elif not (start_timeout is None or isinstance(start_timeout, timedelta)):
            raise ValueError(
                f"trainer.strategy.start_timeout={start_timeout!r}: give seconds (a number > 0), e.g. "
                "trainer.strategy.start_timeout=600, or null (as trainer.strategy.timeout)"
            )
        if start_timeout is not None:
            self._timeout = start_timeout  # what Lightning hands to init_process_group

    def setup_distributed(self) -> None:
        super().setup_distributed()
        if torch.distributed.is_initialized() and self.collective_timeout not in (None, self._timeout):
            torch.distributed.set_timeout(self.collective_timeout)


class DDPStrategy(StartTimeout, L.pytorch.strategies.DDPStrategy):
    """Lightning's DDPStrategy with `start_timeout`."""


class FSDPStrategy(StartTimeout, L.pytorch.strategies.FSDPStrategy):
    """Lightning's FSDPStrategy with `start_timeout`."""


def ddp_strategy(**kwargs: Any) -> DDPStrategy:
    """Lightning's DDPStrategy with `start_timeout` for joining the run apart from `timeout` for collectives."""
    return DDPStrategy(**kwargs)


# -- FSDP -------------------------------------------------------------------------------------------
def fsdp_strategy(
    wrap: Sequence[str] = ("zoo.nn.blocks.TransformerBlock",),
    activation_checkpointing: Sequence[str] | None = None,
    **kwargs: Any,
) -> FSDPStrategy:
    """Lightning's FSDPStrategy with the wrap and activation-checkpointing policies named by class path
    (YAML can name classes, not hold them), and `start_timeout` as ddp_strategy's. Every TransformerBlock becomes
    its own FSDP unit."""
    policy = {get_class(path) for path in wrap} if wrap else None
    checkpointing = {get_class(path) for path in activation_checkpointing} if activation_checkpointing else None
    return FSDPStrategy(auto_wrap_policy=policy, activation_checkpointing_policy=checkpointing, **kwargs)


# -- a rank that died -------------------------------------------------------------------------------
# What gloo and NCCL say when the process at the other end of a collective is gone or silent. A collective
# waits at most the strategy's `timeout` (conf/trainer/ddp*.yaml: trainer.strategy.timeout), so a rank that
# hangs instead of dying is caught too.
PEER_LOST = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|Timed out|timed out|timeout|NCCL (?:error|communicator)|"
    r"ProcessGroup\w* .*(?:aborted|terminated)|DistBackendError",
    re.IGNORECASE,
)


def lost_peer(error: BaseException, world_size: int, rank: int) -> str | None:
    """One line for a collective that failed because another process of the run died or timed out (as seen
    by process `rank`); None for anything else (or a run of one process)."""
    if world_size <= 1 or not isinstance(error, RuntimeError):
        return None
    backend_error = getattr(torch.distributed, "DistError", ())
    text = str(error)
    if not (isinstance(error, backend_error) or PEER_LOST.search(text)):
        return None
    said = PEER_LOST.search(text)
    return (
        f"another process of this {world_size}-process run died or stopped answering (rank {rank} saw: "
        f"{said.group(0) if said else type(error).__name__}); the run stops"
    )


# -- replica check ----------------------------------------------------------------------------------
def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer, in name order: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        if torch.is_tensor(tensor):
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ReplicaCheck(L.Callback):
    """Proves data parallelism did what it should: records the training loss of every batch averaged over
    all ranks (the loss of the global batch), and at the end of fit a digest of each rank's weights.

    Rank 0 writes {world_size, losses, weight_digests, replicas_identical} to `<dirpath>/replica_check.json`.
    With `strict`, replicas that drifted apart (e.g. a parameter missing from gradient sync) are an error.
    Add it with `+callbacks.replica_check._target_=zoo.training.distributed.ReplicaCheck`.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "replica_check.json", strict: bool = True) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self.strict = strict
        self.losses: list[float] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, Mapping) else outputs
        if loss is None:
            return
        # float64 so the mean over ranks adds no rounding of its own
        global_loss = trainer.strategy.reduce(loss.detach().double(), reduce_op="mean")
        self.losses.append(float(global_loss))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        digest = weights_digest(pl_module)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            digests: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(digests, digest)
        else:
            digests = [digest]
        identical = len(set(digests)) == 1
        if trainer.is_global_zero:
            folder = Path(self.dirpath or trainer.default_root_dir)
            folder.mkdir(parents=True, exist_ok=True)
            record = {
                "world_size": trainer.world_size,
                "losses": self.losses,
                "weight_digests": digests,
                "replicas_identical": identical,
            }
            (folder / self.filename).write_text(json.dumps(record, indent=2) + "\n")
        if self.strict and not identical:
            raise RuntimeError(f"data-parallel replicas diverged: weight digests differ across ranks {digests}")
