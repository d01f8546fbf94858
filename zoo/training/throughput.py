"""Throughput and model FLOPs utilisation (MFU) of every training run: a Lightning callback, the FLOP count of a
training step, and the device's peak FLOP/s (dense datasheet figures for GPUs, a cached matmul probe on CPUs).

MFU = the FLOPs one training batch needs (forward + backward, counted once) / its step time / the device's peak
(Chowdhery et al. 2022, PaLM, appendix B; nanoGPT's `estimate_mfu` and litgpt log the same ratio).

FLOPs come from torch.utils.flop_counter.FlopCounterMode around the first real training batch, not from
Lightning's `measure_flops`: that runs a forward and backward of its own, which needs the task's loss outside its
training_step and adds gradients to the real parameters unless the model is copied to the meta device. Counting the
real first batch sees what a step runs (the loss, the backward, the attention kernel actually taken) at the cost of
one slower step, which is left out of the timings. The counter knows matmuls, convolutions and the CUDA attention
kernels; zoo adds the CPU flash-attention kernel and counts every attention backward without the scores a fused
kernel recomputes (model FLOPs). FlexAttention refuses to run under the counter: such a step runs again without it,
and MFU is unknown for that run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import time
import warnings
from datetime import date
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from zoo.training.callbacks import collect_rng_state, restore_rng_state

log = logging.getLogger("zoo")

# The metrics, as logged (docs/scaling-up.md, "Throughput and MFU"); per device, on the timed logging steps. Each
# self.log costs Lightning a fraction of a millisecond, so nothing derivable from these is logged as well.
STEP_MS = "train/step_ms"
SAMPLES_PER_S = "train/samples_per_s"
MFU = "train/mfu"
FLOPS_PER_BATCH = "train/flops_per_batch"
# Measurements of the machine, not of the run (two runs of one config differ in them); the progress bar shows them.
MEASURED = (STEP_MS, SAMPLES_PER_S, "train/tokens_per_s", "train/images_per_s", MFU)


# -- counting ---------------------------------------------------------------------------------------------
def attention_forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Q K^T and the weighted sum of V: 2 b h s_q s_k (d_q + d_v) (torch's sdpa_flop_count)."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """The four products of attention's backward (the gradients of Q, K, V and the scores): twice the forward.
    torch's formula adds the scores that fused kernels recompute; model FLOPs leave recomputation out (PaLM's
    MFU, nanoGPT's 12 L T d per token), so the same model counts the same on every kernel."""
    return 2 * flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


aten = torch.ops.aten
ATTENTION_KERNELS: dict[Any, Any] = {
    aten._scaled_dot_product_flash_attention_for_cpu: attention_forward_flops,  # not in torch's table
    aten._scaled_dot_product_flash_attention_for_cpu_backward: attention_backward_flops,
    aten._scaled_dot_product_flash_attention_backward: attention_backward_flops,
    aten._scaled_dot_product_efficient_attention_backward: attention_backward_flops,
    aten._scaled_dot_product_cudnn_attention_backward: attention_backward_flops,
}


def flop_counter_mode() -> FlopCounterMode:
    """torch's FLOP counter, quiet, counting model FLOPs for every SDPA kernel (the CPU flash kernel added,
    backward without recomputation)."""
    return FlopCounterMode(display=False, custom_mapping=ATTENTION_KERNELS)


# -- the device's peak --------------------------------------------------------------------------------------
def compute_dtype(precision: str | None) -> torch.dtype:
    """The dtype the matmuls of a Lightning precision ("bf16-mixed", "32-true", ...) run in."""
    precision = str(precision or "32")
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16") or precision.startswith("transformer-engine-float16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


def cpu_model() -> tuple[str, str]:
    """The CPU's model name and its flags (the ISA extensions that decide the matmul kernels), as the OS says."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            field, _, value = line.partition(":")
            fields.setdefault(field.strip(), value.strip())  # the first core's
    except OSError:  # not Linux: what platform knows
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    return name, fields.get("flags") or fields.get("Features") or ""


def cpu_key(dtype: torch.dtype, threads: int | None = None) -> str:
    """What a CPU's matmul peak depends on: the model, its flags, the dtype, the threads (default: the current
    count) and torch's kernels."""
    name, flags = cpu_model()
    digest = hashlib.sha1(flags.encode()).hexdigest()[:12]
    dtype_name = str(dtype).removeprefix("torch.")
    threads = torch.get_num_threads() if threads is None else threads
    return f"{name} | flags {digest} | {dtype_name} | {threads} threads | torch {torch.__version__}"


THREADS = re.compile(r" \| (\d+) threads \| ")


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"


def matmul_peak(dtype: torch.dtype, device: str = "cpu", largest: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of a square matmul, the best of `repeats`; the size doubles from 256 to `largest` while one matmul
    takes under 50 ms, so a CPU that emulates the dtype slowly is probed in about a second too."""
    size = 256
    generator = torch.Generator(device).manual_seed(0)  # its own: a probe mid-run leaves the run's draws as they were
    while True:
        a, b = (torch.randn(size, size, dtype=dtype, device=device, generator=generator) for _ in range(2))
        best = float("inf")
        for _ in range(repeats + 1):  # the first run warms up
            start = time.perf_counter()
            a @ b
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        if size >= largest or best > 0.05:
            return 2 * size**3 / best
        size *= 2


# A probe beside other jobs reads low, never high: a CPU's peak is the best of several probes, each in its own run
# (one run's probes would share its neighbours), and is probed again while it is implausible against the same CPU's
# peaks at other thread counts; one still implausible after PROBES_AT_MOST is the machine's own (two threads on the
# hyperthreads of one core, say).
PROBES_KEPT = 3
PROBES_AT_MOST = 10
PLAUSIBLE = 0.9  # the tolerance of the thread-count comparison: timing noise of a quiet machine


def implausible(cached: dict[str, Any], key: str) -> bool:
    """Whether the peak cached under `key` is below what the same CPU, dtype and torch reach with other thread
    counts: n threads run at least as fast as fewer (m < n), and at least n/m of more (m > n), within PLAUSIBLE.
    (A 2-thread peak probed while other jobs shared the cores read well below the 1-thread one: issue 69.)"""
    found = THREADS.search(key)
    if found is None:
        return False
    threads, flops = int(found.group(1)), float(cached[key]["flops"])
    for other, entry in cached.items():
        match = THREADS.search(other)
        if other == key or match is None or THREADS.sub(f" | {threads} threads | ", other) != key:
            continue
        others = int(match.group(1))
        if flops < PLAUSIBLE * float(entry["flops"]) * min(1.0, threads / others):
            return True
    return False


def cpu_peak_flops(dtype: torch.dtype, cache_dir: Path | None = None) -> float:
    """This CPU's matmul peak in `dtype` with the current threads, kept in a cache file (the key: cpu_key): the
    best of the probes so far (about a second each, one per call: a run calls this once), probed again until
    PROBES_KEPT were taken, and while the best is implausible against other thread counts (up to PROBES_AT_MOST)."""
    path = (cache_dir or default_cache_dir()) / "peak_flops.json"
    key = cpu_key(dtype)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    probes = int(entry.get("probes", 1)) if entry else 0  # entries written before zoo counted them: one probe
    if entry and (probes >= PROBES_AT_MOST or (probes >= PROBES_KEPT and not implausible(cached, key))):
        return float(entry["flops"])
    flops = max(matmul_peak(dtype), float(entry["flops"]) if entry else 0.0)
    how = "the best square matmul of one probe per run, zoo.training.throughput.cpu_peak_flops"
    cached[key] = {"flops": flops, "probes": probes + 1, "measured": f"{date.today()}", "how": how}
    try:  # a read-only home only costs the probe again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(cached, indent=1))
        temporary.replace(path)
    except OSError:
        pass
    return flops


# Dense peaks (FLOP/s) of GPUs that Lightning's table misses or lists with 2:4 sparsity: its H200 rows are the
# datasheet's sparse figures and match only names with "sxm1" / "nvl1", while the H200 reports "NVIDIA H200"
# (NVIDIA H200 datasheet: the sparse tensor-core figures halved). Keys: a lower-case part of the device name.
DENSE_PEAKS = {
    "h200 nvl": {torch.bfloat16: 835.5e12, torch.float16: 835.5e12, "tfloat32": 417.5e12, torch.float32: 60e12},
    "h200": {torch.bfloat16: 989.5e12, torch.float16: 989.5e12, "tfloat32": 494.7e12, torch.float32: 67e12},
}


def gpu_peak_flops(name: str, dtype: torch.dtype) -> float | None:
    """A dense peak from DENSE_PEAKS for this device name (fp32 read as TF32 unless matmul precision is highest)."""
    for part, peaks in DENSE_PEAKS.items():
        if part in name.lower():
            key = "tfloat32" if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest" else dtype
            return peaks.get(key)
    return None


def device_peak_flops(device: torch.device, dtype: torch.dtype, cpu_probe: bool = True, cache_dir=None) -> tuple:
    """(peak FLOP/s or None, where it came from or why it is unknown): dense datasheet figures for GPUs and TPUs
    (DENSE_PEAKS, then Lightning's table; fp32 on Ampere and later reads the TF32 peak unless matmul precision is
    "highest"), the cached matmul probe on a CPU."""
    if device.type == "cpu":
        if not cpu_probe:
            return None, "the CPU probe is off (callbacks.throughput.cpu_probe=false)"
        return cpu_peak_flops(dtype, cache_dir), "a measured matmul on this CPU"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    if peak := gpu_peak_flops(name, dtype):
        return peak, "the datasheet, dense (zoo.training.throughput.DENSE_PEAKS)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a device missing from the table: said once, in our own words
        peak = get_available_flops(device, dtype)
    if peak:
        return float(peak), "the datasheet (Lightning's table)"
    return None, f"{name!r} in {str(dtype).removeprefix('torch.')} is not in Lightning's table of peaks"


# SI prefixes as datasheets write peaks (312 TFLOP/s is "312T" on the command line)
FLOPS_PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
FLOPS_TEXT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGTPE]?)\s*(?:FLOP/?S)?\s*", re.IGNORECASE)


def parse_flops(value: Any, key: str = "callbacks.throughput.peak_flops") -> float | None:
    """A peak FLOP/s as people write it: a number (312e12, 1.2e15) or one with an SI prefix (312T, 989.5T, 1.5P,
    50G, "312 TFLOP/s"); None stays None. Anything else, or a peak <= 0, is one line naming `key`."""
    if value is None:
        return None
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if isinstance(value, str) and (match := FLOPS_TEXT.fullmatch(value)):
        number = float(match.group(1)) * FLOPS_PREFIXES[match.group(2)]
    if number is None or not number > 0:
        raise ValueError(
            f"{key} must be a positive FLOP/s such as 312e12, 312T, 989.5T, 1.5P or 50G (or null), got {value!r}"
        )
    return float(number)


# -- the callback -------------------------------------------------------------------------------------------
def batch_counts(pl_module: L.LightningModule, batch: Any) -> dict[str, int]:
    """What one batch holds: the task's own `throughput_counts(batch)` ({"samples": n, "tokens": m} or "images"),
    else the leading size of the batch's first tensor as its samples."""
    counts = getattr(pl_module, "throughput_counts", None)
    if counts is not None:
        return dict(counts(batch))
    first = next(iter(t for t in _tensors(batch) if t.ndim > 0), None)
    return {"samples": int(first.shape[0])} if first is not None else {}


def _tensors(batch: Any):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


class Throughput(Callback):
    """Samples/s, tokens/s or images/s, step time and MFU of the training batches, in every logger and the
    progress bar.

    The FLOPs of one training batch are counted once, in the first batch of a fit (FlopCounterMode: its dispatch
    hooks make that step slower, so it is not timed). A forward the counter cannot run (FlexAttention refuses to
    run under a dispatch mode) is run again without it, from the same random state: the step is as without this
    callback, and MFU is unknown (one line says so). Then each batch whose metrics a logger writes (every
    trainer.log_every_n_steps) is timed from its start to its end: forward, loss, backward and optimiser step,
    data loading excluded, with the GPU synchronised at both ends of that batch only. Values are per device.

    Args:
        peak_flops: the device's peak FLOP/s for MFU (a number, or with an SI prefix: 312T, 1.5P, 50G); None:
            Lightning's table for GPUs, a probe on the CPU.
        cpu_probe: on the CPU, measure a matmul's FLOP/s per host, dtype and thread count, the best of the first
            runs' probes (cached in `cache_dir`: cpu_peak_flops); false: MFU is unknown on the CPU (one line says
            so, and train/mfu is not logged).
        cache_dir: where the probe's results are kept; None: $XDG_CACHE_HOME/zoo or ~/.cache/zoo.
    """

    def __init__(
        self, peak_flops: float | str | None = None, cpu_probe: bool = True, cache_dir: str | None = None
    ) -> None:
        self.peak_flops = parse_flops(peak_flops)
        self.peak_source = "callbacks.throughput.peak_flops" if peak_flops is not None else None
        self.cpu_probe = cpu_probe
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.flops_per_batch: int | None = None  # forward + backward of one training batch, on one device
        self._counter: FlopCounterMode | None = None
        self._quiet: warnings.catch_warnings | None = None
        self._counted = False
        self._peak_looked_up = peak_flops is not None
        self._start: float | None = None
        self.last: dict[str, float] = {}  # the metrics of the last timed batch (what was logged)

    # FLOPs: the first training batch of a fit, inside the counter
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args) -> None:
        self._start = None
        if not self._counted:
            self._counted = True
            self._start_counting(pl_module)
            return
        if logs_this_step(trainer):
            self._look_up_peak(trainer)  # before the clock starts: the CPU probe takes about a second, once
            synchronize(pl_module.device)
            self._start = time.perf_counter()

    def _start_counting(self, pl_module: L.LightningModule) -> None:
        # torch.compile warns about the counter's global module hooks; the compiled network runs eager meanwhile
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message=".*global hooks on modules")
        self._counter = flop_counter_mode()
        self._counter.__enter__()
        state, training_step = collect_rng_state(), pl_module.training_step

        def counted_training_step(*args: Any, **kwargs: Any) -> Any:
            del pl_module.training_step  # this batch only
            try:
                return training_step(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 (run again without the counter: a real error comes back)
                self._stop_counting(failed=error)
                restore_rng_state(state)
                return training_step(*args, **kwargs)

        pl_module.training_step = counted_training_step

    def _stop_counting(self, failed: Exception | None = None) -> None:
        if self._counter is None:
            return
        self._counter.__exit__(None, None, None)
        self._quiet.__exit__(None, None, None)
        if failed is None:
            self.flops_per_batch = int(self._counter.get_total_flops()) or None
        else:
            note_unknown_mfu(
                f"the training step cannot run under torch's FLOP counter ({type(failed).__name__}); "
                "step time and throughput are logged without it"
            )
        self._counter = self._quiet = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, *args) -> None:
        if self._counter is not None:
            self._stop_counting()
            pl_module.__dict__.pop("training_step", None)  # a batch that skipped its step
            return
        if self._start is None:
            return
        synchronize(pl_module.device)
        seconds = time.perf_counter() - self._start
        self._start = None
        metrics = {STEP_MS: 1000 * seconds}
        for unit, count in batch_counts(pl_module, batch).items():
            metrics[f"train/{unit}_per_s"] = count / seconds
        if self.flops_per_batch:
            metrics[FLOPS_PER_BATCH] = float(self.flops_per_batch)
            if self.peak_flops:
                metrics[MFU] = self.flops_per_batch / seconds / self.peak_flops
        self.last = metrics
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, prog_bar=name in MEASURED, batch_size=1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_counting()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop_counting()
        pl_module.__dict__.pop("training_step", None)

    def _look_up_peak(self, trainer: L.Trainer) -> None:
        if self._peak_looked_up:
            return
        self._peak_looked_up = True
        dtype = compute_dtype(trainer.precision)
        self.peak_flops, self.peak_source = device_peak_flops(
            trainer.strategy.root_device, dtype, self.cpu_probe, self.cache_dir
        )
        if self.peak_flops is None:
            note_unknown_mfu(f"{self.peak_source}; set callbacks.throughput.peak_flops=<FLOP/s> to log train/mfu")


@rank_zero_only
def note_unknown_mfu(reason: str) -> None:
    log.info(f"MFU unknown: {reason}")


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the loggers write step metrics after this batch (as zoo.tasks.base.ZooTask.logging_this_step)."""
    step, every = trainer.global_step + 1, trainer.log_every_n_steps
    return (every > 0 and step % every == 0) or step == trainer.max_steps


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
