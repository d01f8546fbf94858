"""Training step time and peak memory of one run, measured inside it by a Lightning callback.

The variant study adds it to a few-step run of each row on each column (`--tasks cost`): the cost of a setting at
the task's own length, batch and model, beside the quality the full jobs reach. Added to any run:

    python run.py model=vit +callbacks.step_cost._target_=experiments.step_cost.StepCost \
        +callbacks.step_cost.path=step_cost.json trainer.max_steps=8

Step time: from the start of a training batch to its end (forward, backward, optimiser step; data loading not
counted), the median over the steps after `warmup`. Peak memory: the high-water mark of tensor bytes over the last
step, above what was live at its start (activations, gradients, the optimiser's update), recorded by the torch
profiler as experiments/attention_benchmark.py measures it; on CUDA the allocator's own peak. The profiled step is
not timed (the profiler slows it).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from experiments.attention_benchmark import memory_profile, profiled_peak

WARMUP = 2  # steps not timed: the first ones allocate the optimiser's state and warm the kernels


class StepCost(Callback):
    """Times training steps `warmup` .. max_steps - 2 and profiles the memory of the last one; writes
    {"step_ms", "steps", "peak_mib", "batch_size"} to `path` when training ends."""

    def __init__(self, path: str, warmup: int = WARMUP) -> None:
        self.path = Path(path)
        self.warmup = warmup
        self.times: list[float] = []
        self.started = 0.0
        self.profiler: Any = None
        self.base = 0
        self.peak: int | None = None
        self.batch_size: int | None = None

    def profiled(self, trainer: L.Trainer) -> bool:
        return trainer.max_steps > 0 and trainer.global_step == trainer.max_steps - 1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.batch_size is None:
            tensors = [batch] if torch.is_tensor(batch) else [v for v in _values(batch) if torch.is_tensor(v)]
            self.batch_size = int(tensors[0].shape[0]) if tensors else None
        if self.profiled(trainer):
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize()
                self.base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            else:
                self.profiler = memory_profile()
                self.profiler.__enter__()
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        elapsed = time.perf_counter() - self.started
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - self.started
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.peak, self.profiler = profiled_peak(self.profiler), None
        elif pl_module.device.type == "cuda" and trainer.global_step == trainer.max_steps:
            self.peak = torch.cuda.max_memory_allocated() - self.base
        elif trainer.global_step > self.warmup:  # global_step counts this batch's optimiser step already
            self.times.append(1000 * elapsed)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        result = {
            "step_ms": statistics.median(self.times) if self.times else None,
            "steps": len(self.times),
            "peak_mib": self.peak / 2**20 if self.peak is not None else None,
            "batch_size": self.batch_size,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(result, indent=1) + "\n")


def _values(batch: Any) -> list[Any]:
    if isinstance(batch, dict):
        return list(batch.values())
    if isinstance(batch, (list, tuple)):
        return list(batch)
    return []
