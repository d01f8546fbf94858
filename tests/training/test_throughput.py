"""Throughput and MFU (zoo/training/throughput.py): the FLOPs counted once equal a hand count, every family's CSV
log holds the metrics, an unknown peak says so in one line, and the CPU probe is read from its cache."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tests.helpers import run_in_process
from zoo.attention.fast import set_fast_kernels, use_fast_kernels
from zoo.data.text import TextDataModule
from zoo.models.gpt import GPT, GPTConfig
from zoo.tasks.language_model import LanguageModelTask
from zoo.training import throughput
from zoo.training.throughput import Throughput, compute_dtype, cpu_peak_flops, device_peak_flops, flop_counter_mode

BATCH, IN, OUT = 8, 12, 5


class LinearTask(L.LightningModule):
    """One linear layer, loss = the sum of its outputs: forward 2*B*in*out FLOPs, backward the weight's gradient
    (another 2*B*in*out; the input needs none, the bias gradient is a sum, no matmul)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(IN, OUT)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        data = torch.utils.data.TensorDataset(torch.randn(6 * BATCH, IN), torch.zeros(6 * BATCH))
        return torch.utils.data.DataLoader(data, batch_size=BATCH)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module: L.LightningModule, callback: Throughput, root: Path, steps: int = 4, data=None) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=steps, log_every_n_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=str(root), callbacks=[callback], limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return trainer


def text_data(root: Path) -> TextDataModule:
    corpus = root / "text.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200)))
    return TextDataModule(path=str(corpus), block_size=16, batch_size=4, eval_batches=1, eval_batch_size=4)


def test_flops_of_a_linear_layer_are_counted_once_and_equal_the_hand_count(tmp_path: Path, monkeypatch) -> None:
    counters = []
    monkeypatch.setattr(throughput, "flop_counter_mode", lambda: counters.append(flop_counter_mode()) or counters[-1])
    callback = Throughput(peak_flops=1e12)
    trainer = fit(LinearTask(), callback, tmp_path)
    assert len(counters) == 1  # the first batch only: later steps run without the counter's hooks
    assert callback.flops_per_batch == 4 * BATCH * IN * OUT
    metrics = trainer.callback_metrics
    assert metrics["train/flops_per_batch"] == 4 * BATCH * IN * OUT
    seconds = metrics["train/step_ms"].item() / 1000
    assert metrics["train/samples_per_s"].item() == pytest.approx(BATCH / seconds, rel=1e-4)
    assert metrics["train/mfu"].item() == pytest.approx(4 * BATCH * IN * OUT / seconds / 1e12, rel=1e-4)


def gpt_matmul_flops(config: GPTConfig, batch: int) -> int:
    """Every matmul of a GPT training step, by hand: 6 FLOPs per weight and token (forward 2, backward 4: the
    input's and the weight's gradients), and attention's two (T x T) products, 3x for the backward (Kaplan et
    al. 2020, table 1; nanoGPT's estimate_mfu counts the same 12 L T d per token)."""
    d, layers, tokens = config.n_embd, config.n_layer, batch * config.block_size
    hidden = config.mlp_dim or 4 * d
    weights = layers * (3 * d * d + d * d + 2 * d * hidden) + d * config.vocab_size  # the tied LM head
    return 6 * weights * tokens + 12 * layers * config.block_size * d * tokens


@pytest.mark.parametrize("fast", [True, False], ids=["fast-kernels", "reference-kernels"])
def test_flops_of_a_tiny_gpt_step_equal_the_matmul_count(fast: bool) -> None:
    before = use_fast_kernels()
    set_fast_kernels(fast)
    try:
        config = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
        model = GPT(config)
        x = torch.randint(0, 50, (3, 16))
        with flop_counter_mode() as counter:
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    finally:
        set_fast_kernels(before)
    assert counter.get_total_flops() == gpt_matmul_flops(config, batch=3)


def test_the_language_model_task_logs_the_hand_counted_flops(tmp_path: Path) -> None:
    task = LanguageModelTask(net={"vocab_size": None, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16})
    trainer = fit(task, Throughput(peak_flops=1e12), tmp_path, steps=3, data=text_data(tmp_path))
    metrics = trainer.callback_metrics
    assert metrics["train/flops_per_batch"] == gpt_matmul_flops(task.net.config, batch=4)
    assert metrics["train/tokens_per_s"].item() == pytest.approx(4 * metrics["train/samples_per_s"].item() * 4, 1e-4)


TINY = {
    "gpt": ["model=gpt", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
            "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4"],
    "llama": ["model=llama", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
              "model.sample.max_new_tokens=0", "data.eval_batches=1", "data.batch_size=4"],
    "vit": ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
            "data.batch_size=8"],
    "clip": ["model=clip", "model.net.image.dim=16", "model.net.image.depth=1", "model.net.image.num_heads=2",
             "model.net.image.mlp_dim=32", "model.net.text.dim=16", "model.net.text.depth=1",
             "model.net.text.num_heads=2", "model.net.text.mlp_dim=32", "model.net.embed_dim=16"],
    "translation": ["model=translation", "model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32",
                    "model.net.encoder_layers=1", "model.net.decoder_layers=1", "data.num_train=64",
                    "data.num_val=8", "data.num_test=8"],
    "rnn_translation": ["model=rnn_translation", "model.net.embed_dim=16", "model.net.hidden=16", "data.num_train=64",
                        "data.num_val=8", "data.num_test=8"],
    "sequence_classifier": ["model=sequence_classifier", "model.net.dim=16", "model.net.depth=1",
                            "model.net.num_heads=2", "model.net.mlp_dim=32", "data.batch_size=8"],
}  # fmt: skip
UNIT = {"vit": ("images",), "clip": ("images", "tokens")}


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_family_writes_throughput_and_mfu_to_its_csv_log(family: str, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY[family], "trainer.max_steps=3", "trainer.log_every_n_steps=1", "+trainer.limit_val_batches=1",
            "+trainer.num_sanity_val_steps=0", "test=false", "logger=csv", "print_config=false",
            "callbacks.model_checkpoint=null", "callbacks.rich_model_summary=null",
            "callbacks.throughput.peak_flops=1e11", f"hydra.run.dir={run_dir}",
            f"paths.data_dir={tmp_path / 'data'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-3000:]
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    timed = [row for row in rows if row.get("train/step_ms")]
    assert len(timed) == 2, rows  # steps 2 and 3: the first is the counted one
    for unit in ("samples", *UNIT.get(family, ("tokens",))):
        assert all(float(row[f"train/{unit}_per_s"]) > 0 for row in timed), unit
    for row in timed:
        flops, seconds = float(row["train/flops_per_batch"]), float(row["train/step_ms"]) / 1000
        assert flops > 0 and float(row["train/mfu"]) == pytest.approx(flops / seconds / 1e11, rel=1e-3)


def test_an_unknown_peak_says_so_in_one_line_and_logs_no_mfu(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="zoo"):
        trainer = fit(LinearTask(), Throughput(cpu_probe=False), tmp_path)
    notes = [record.getMessage() for record in caplog.records if "MFU" in record.getMessage()]
    assert notes == [
        "MFU unknown: the CPU probe is off (callbacks.throughput.cpu_probe=false); "
        "set callbacks.throughput.peak_flops=<FLOP/s> to log train/mfu"
    ]
    assert "train/mfu" not in trainer.callback_metrics and trainer.callback_metrics["train/step_ms"] > 0


def test_the_cpu_probe_keeps_the_best_of_a_few_runs_per_host_dtype_and_threads_then_reads_its_cache(
    tmp_path: Path, monkeypatch
) -> None:
    probes, results = [], iter([1e10, 2e10, 1.5e10, 9e10])
    monkeypatch.setattr(throughput, "matmul_peak", lambda dtype: probes.append(dtype) or next(results))
    peaks = [cpu_peak_flops(torch.float32, tmp_path) for _ in range(4)]  # one call per run
    assert peaks == [1e10, 2e10, 2e10, 2e10]  # the best so far; then from the file: the 9e10 is never drawn
    assert probes == [torch.float32] * throughput.PROBES_KEPT
    monkeypatch.setattr(throughput, "matmul_peak", lambda dtype: probes.append(dtype) or 2e10)
    assert cpu_peak_flops(torch.bfloat16, tmp_path) == 2e10 and probes[-1] == torch.bfloat16  # its own entry
    # and the callback reads the same cache: no probe, the cached peak
    callback = Throughput(cache_dir=str(tmp_path))
    trainer = fit(LinearTask(), callback, tmp_path)
    assert len(probes) == 4 and callback.peak_flops == 2e10 and trainer.callback_metrics["train/mfu"] > 0


def test_a_peak_probed_under_load_is_probed_again_until_it_is_plausible_against_other_thread_counts(
    tmp_path: Path, monkeypatch
) -> None:
    """The machine that prompted this: its first 2-thread probes shared the cores (16.6 GFLOP/s), its 1-thread peak
    was 44.0; the 2-thread peak is probed again in later runs, and kept once a quiet run measures it."""
    one, two = throughput.cpu_key(torch.float32, 1), throughput.cpu_key(torch.float32, 2)
    cache = tmp_path / "peak_flops.json"
    kept = {"measured": "2026-01-01", "how": "test"}
    cache.write_text(json.dumps({one: {"flops": 44.0e9, "probes": 3, **kept}, two: {"flops": 16.6e9, "probes": 3,
                                                                                      **kept}}))  # fmt: skip
    probed = iter([17.0e9, 80.0e9, 10.0e9])
    monkeypatch.setattr(throughput, "matmul_peak", lambda dtype: next(probed))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        peaks = [cpu_peak_flops(torch.float32, tmp_path) for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert peaks == [17.0e9, 80.0e9, 80.0e9]  # still under load, then quiet: plausible, and no third probe
    assert json.loads(cache.read_text())[two]["probes"] == 5
    assert next(probed) == 10.0e9


def test_peaks_across_thread_counts_are_plausible_within_the_tolerance() -> None:
    key = {n: throughput.cpu_key(torch.float32, n) for n in (1, 2, 4)}
    entry = lambda flops: {"flops": flops}  # noqa: E731
    quiet = {key[1]: entry(44e9), key[2]: entry(85e9), key[4]: entry(160e9)}
    assert not any(throughput.implausible(quiet, k) for k in quiet)
    assert throughput.implausible({**quiet, key[2]: entry(16.6e9)}, key[2])  # below the 1-thread peak
    assert throughput.implausible({**quiet, key[1]: entry(20e9)}, key[1])  # below a quarter of the 4-thread peak
    hyperthreads = {key[1]: entry(44e9), key[2]: entry(42e9)}  # two threads on one core: no faster, within noise
    assert not throughput.implausible(hyperthreads, key[2])
    other_dtype = {key[1]: entry(44e9), throughput.cpu_key(torch.bfloat16, 2): entry(5e9)}
    assert not any(throughput.implausible(other_dtype, k) for k in other_dtype)  # another dtype is no reference


def test_a_real_matmul_probe_measures_a_plausible_peak_and_leaves_the_runs_random_draws_alone() -> None:
    state = torch.get_rng_state()
    peak = throughput.matmul_peak(torch.float32, largest=256, repeats=1)
    assert 1e7 < peak < 1e14  # a CPU core does between tens of MFLOP/s and tens of TFLOP/s
    assert torch.equal(torch.get_rng_state(), state)  # else a resumed run, probing or not, would draw differently


def test_the_probes_peak_is_two_n_cubed_over_the_best_time_at_the_first_size_past_50_ms(monkeypatch) -> None:
    """A matmul of two n x n matrices is 2 n^3 FLOPs. With a scripted clock: at n=256 the best of the 4 timed runs
    (a warm-up and 3 repeats) is 10 ms, under 50 ms, so the size doubles; at n=512 it is 80 ms: the peak is
    2 * 512^3 / 0.08 FLOP/s, by hand 3.3554432e9."""
    seconds = iter([0.5, 0.02, 0.01, 0.03, 0.3, 0.09, 0.08, 0.1])  # per timed run, in order
    clock = [0.0]

    def perf_counter() -> float:  # called at a run's start and end: the end advances by the run's scripted time
        clock.append(clock[-1] + (next(seconds) if len(clock) % 2 == 0 else 0.0))
        return clock[-1]

    monkeypatch.setattr(throughput.time, "perf_counter", perf_counter)
    peak = throughput.matmul_peak(torch.float32, largest=2048, repeats=3)
    assert peak == pytest.approx(3.3554432e9, rel=1e-12) and next(seconds, None) is None  # no run past n=512


def test_gpu_peaks_come_from_lightnings_table_and_an_unknown_gpu_is_named(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert device_peak_flops(torch.device("cuda"), torch.bfloat16) == (989.4e12, "the datasheet (Lightning's table)")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")  # Lightning has none
    assert device_peak_flops(torch.device("cuda"), torch.bfloat16)[0] == 989.5e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Imaginary 9000")
    peak, reason = device_peak_flops(torch.device("cuda"), torch.bfloat16)
    assert peak is None and reason == "'NVIDIA Imaginary 9000' in bfloat16 is not in Lightning's table of peaks"


@pytest.mark.parametrize(
    ("written", "flops"),
    [("312T", 312e12), ("989.5T", 989.5e12), ("1.5P", 1.5e15), ("50G", 50e9), ("1.2e15", 1.2e15), (1.2e15, 1.2e15),
     ("312 TFLOP/s", 312e12), ("312e12", 312e12), (7, 7.0), (None, None)],
)  # fmt: skip
def test_a_peak_is_taken_as_people_write_it(written, flops) -> None:
    assert Throughput(peak_flops=written, cpu_probe=False).peak_flops == flops


@pytest.mark.parametrize("written", ["312X", "T312", "fast", "-5T", 0, True, "312TT"])
def test_a_peak_that_is_no_flop_rate_is_one_line_naming_the_key_and_the_forms(written) -> None:
    with pytest.raises(ValueError, match=r"^callbacks.throughput.peak_flops must be a positive FLOP/s such as "
                                         r"312e12, 312T, 989.5T, 1.5P or 50G \(or null\), got ") as error:  # fmt: skip
        Throughput(peak_flops=written)
    assert "\n" not in str(error.value)


def test_precisions_map_to_the_dtype_of_their_matmuls() -> None:
    expected = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16,
                "16-mixed": torch.float16, "64-true": torch.float64, None: torch.float32}  # fmt: skip
    assert {name: compute_dtype(name) for name in expected} == expected


def test_peak_flops_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"callbacks.throughput.peak_flops must be a positive FLOP/s .* got 0$"):
        Throughput(peak_flops=0)
    assert math.isclose(Throughput(peak_flops=3e9).peak_flops, 3e9)


class FlexLikeTask(LinearTask):
    """A forward that refuses to run under a dispatch mode, as FlexAttention's does under the FLOP counter."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("torch.compile with fullgraph=True found no compiled frames")
        return self.layer(torch.nn.functional.dropout(batch[0], 0.5)).sum()


def test_a_step_the_counter_cannot_run_runs_without_it_as_if_never_counted(tmp_path: Path, caplog) -> None:
    weights = []
    for callbacks in ([], [Throughput(peak_flops=1e12)]):
        torch.manual_seed(0)
        module = FlexLikeTask()
        with caplog.at_level(logging.INFO, logger="zoo"):
            trainer = L.Trainer(
                max_steps=3, log_every_n_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=callbacks,
            )  # fmt: skip
            trainer.fit(module)
        weights.append(module.layer.weight.detach().clone())
    assert torch.equal(*weights)  # the same dropout masks: the failed try left the random state as it was
    assert [r.getMessage() for r in caplog.records if "MFU" in r.getMessage()] == [
        "MFU unknown: the training step cannot run under torch's FLOP counter (RuntimeError); "
        "step time and throughput are logged without it"
    ]
    metrics = trainer.callback_metrics
    assert metrics["train/samples_per_s"] > 0 and "train/mfu" not in metrics and "train/flops_per_batch" not in metrics
    assert "training_step" not in module.__dict__
