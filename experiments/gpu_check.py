"""GPU checks, one run of under 8 minutes on one GPU, reported in one JSON and one Markdown page.

    python experiments/gpu_check.py                       # CUDA: writes experiments/results/gpu_check.{md,json}
    python experiments/gpu_check.py --device cpu --quick  # the same code on the CPU, small (outputs/gpu_check/)

1. flash: zoo's full causal attention (with and without RoPE) in bf16 with PyTorch restricted to the flash kernel
   (sdpa_kernel(FLASH_ATTENTION): an error if a call would fall back), and equal to the fp32 math to bf16 precision.
2. variants: every registered attention kernel (zoo/attention/registry.py) with each of its example_options, causal
   and not, and the position biases where a kernel takes them: output and gradients on the device (CUDA: backend
   auto, so FlexAttention for the pattern kernels) equal to the CPU reference (fast kernels off) on the same inputs
   and weights; the CUDA kernels each ran, from the profiler.
3. gpt2_small: GPT-2 small (12 layers, 12 heads, 768 wide, block 1024, vocabulary 50304) trained in bf16-mixed
   through Lightning with zoo's Throughput callback (zoo/training/throughput.py): tokens/s and MFU as every run
   logs them, eager and compiled; the counted FLOPs next to nanoGPT's estimate (6 N + 12 L T d per token), whose
   own anchor is ~37% MFU on an A100.
4. bias_speed: full attention with ALiBi and T5 biases (FlexAttention score_mods where zoo has them; which kernel
   ran is read from the profiler) against plain flex (a causal block mask, no score_mod) and SDPA, bf16 training.
5. ddp: one 2-rank DDP training step (NCCL) where 2 GPUs are visible, checking the ranks end with equal weights;
   skipped, and said, otherwise.
6. bf16_training: `python run.py model=gpt trainer=gpu` for a short run: the validation loss is finite and low, and
   the run's own train/mfu (the callback on a real run) is reported.
With --extras: the kernel of each attention_benchmark row, that benchmark on CUDA, and the RNN step-time sweep.

Sections run in the order flash, gpt2_small, bias_speed, ddp, bf16_training, variants (last, within its own
180 s: each FlexAttention case compiles) and start within --budget seconds; one that would start later is skipped
and says so. Each section's failure is reported in its row; the exit status is 1 if any section failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.attention import AttentionConfig, MultiHeadAttention, TokenLayout, registry  # noqa: E402
from zoo.attention.fast import set_fast_kernels, use_fast_kernels  # noqa: E402
from zoo.training.throughput import cpu_model  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
NANOGPT_ANCHOR = "nanoGPT: ~37% MFU, GPT-2 small on an A100 (its README)"
OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"

# Profiler op names -> the attention kernel they belong to.
KERNEL_OPS = {
    "_scaled_dot_product_flash_attention": "sdpa flash",
    "_scaled_dot_product_efficient_attention": "sdpa mem-efficient",
    "_scaled_dot_product_cudnn_attention": "sdpa cudnn",
    "_scaled_dot_product_attention_math": "sdpa math",
    "_scaled_dot_product_fused_attention_overrideable": "sdpa overrideable",
    "flex_attention": "flex",
    "triton_tem_fused": "flex (compiled triton template)",
}


def kernels_seen(run: Callable[[], Any]) -> list[str]:
    """The attention kernels `run()` calls, from the profiler's op names (CUDA)."""
    with torch.profiler.profile() as prof:
        run()
        torch.cuda.synchronize()
    return sorted({label for event in prof.events() for op, label in KERNEL_OPS.items() if op in event.name})


# -- 1. flash ---------------------------------------------------------------------------------------------
def check_flash(device: str, quick: bool = False) -> dict:
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA (the flash SDPA kernel)"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    cases = {}
    length = 256 if quick else 1024
    for rope in (False, True):
        module = MultiHeadAttention(768, 12, "full", causal=True, rope=rope).cuda()
        x = torch.randn(4, length, 768, device="cuda")
        try:
            with torch.no_grad():
                reference = module(x)  # fp32, any kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", torch.bfloat16):
                    flash = module(x)
        except RuntimeError as error:  # no flash kernel for these inputs: the assertion of this check
            cases[f"rope={rope}"] = {"ok": False, "error": str(error).splitlines()[0]}
            continue
        gap = (flash.float() - reference).abs().max().item()
        cases[f"rope={rope}"] = {"ok": gap < 5e-2, "max_abs_diff_vs_fp32": gap}
    return {"status": OK if all(c["ok"] for c in cases.values()) else FAILED, "cases": cases}


# -- 2. every variant against its CPU reference -----------------------------------------------------------
def variant_cases() -> list[tuple[str, dict[str, Any], bool]]:
    """(variant, attention settings, causal) for every registered kernel and example option, causal where the
    kernel can be, and ALiBi and T5 on each kernel that takes a position bias (its first example)."""
    cases = []
    for name, kernel in registry.VARIANTS.items():
        for options in kernel.example_options:
            for causal in (False, True) if kernel.supports_causal else (False,):
                cases.append((name, {"variant": name, **options}, causal))
        if kernel.supports_position_bias:
            for bias in ("alibi", "t5"):
                cases.append((name, {"variant": name, **kernel.example_options[0], "position_bias": bias}, True))
    return cases


def case_name(settings: dict[str, Any], causal: bool) -> str:
    options = ",".join(f"{k}={v}" for k, v in settings.items() if k != "variant")
    return f"{settings['variant']}[{options}]" + (" causal" if causal else "")


def attention_step(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient of one forward and backward (eval mode: LSH's
    rotations fixed by its seed, no dropout)."""
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()  # a gradient that is not uniform
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return [out.detach(), x.grad, *grads]


def compare_variants(
    device: str,
    quick: bool = False,
    cases: list | None = None,
    length: int | None = None,
    dim: int = 64,
    budget_s: float = 180.0,
) -> dict:
    """Each case on `device` (CUDA: backend auto; CPU: the fast kernels) against the CPU reference (fast kernels
    off), fp32 with TF32 off, the same weights and inputs. Cases still waiting after `budget_s` seconds (each
    FlexAttention case compiles its own kernels) are listed as not run."""
    # Past DENSE_MAX_LENGTH (256) the pattern kernels take their blockwise / flex paths; --quick on the CPU stays
    # below it (the dense paths), a few seconds.
    length = length or (384 if device == "cuda" else 48 if quick else 288)
    tolerance = {"rtol": 1e-3, "atol": 1e-4}  # fp32 sums in another order (TF32 off)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    fast = use_fast_kernels()
    rows, start = {}, time.perf_counter()
    try:
        for _, settings, causal in cases or variant_cases():
            name = case_name(settings, causal)
            if time.perf_counter() - start > budget_s:
                rows[name] = {"ok": None, "note": f"not run: past this section's {budget_s:.0f} s"}
                continue
            try:
                torch.manual_seed(0)
                layout = TokenLayout(max_length=length)  # compressed attention projects along the whole length
                config = AttentionConfig(**settings)
                reference_module = MultiHeadAttention(dim, 4, config, causal=causal, layout=layout).eval()
                x = torch.randn(2, length, dim)
                module = copy.deepcopy(reference_module).to(device)
                set_fast_kernels(False)
                reference = attention_step(reference_module, x)
                set_fast_kernels(True)
                x = x.to(device)
                candidate = attention_step(module, x)
                kernels = kernels_seen(lambda m=module, x=x: m(x)) if device == "cuda" else []
                gaps = [(c.cpu() - r).abs().max().item() for c, r in zip(candidate, reference)]
                close = all(torch.allclose(c.cpu(), r, **tolerance) for c, r in zip(candidate, reference))
                rows[name] = {"ok": close, "max_abs_diff_output": gaps[0], "max_abs_diff_grads": max(gaps[1:]),
                              "kernels": kernels}  # fmt: skip
            except Exception as error:  # noqa: BLE001 (one case's failure is its row, the rest still run)
                rows[name] = {"ok": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    finally:
        set_fast_kernels(fast)
        torch.backends.cuda.matmul.allow_tf32 = tf32
    reference_note = "CPU reference: fast kernels off, fp32"
    return {"status": FAILED if any(r["ok"] is False for r in rows.values()) else OK, "length": length, "dim": dim,
            "note": reference_note, "cases": rows}  # fmt: skip


# -- 3. GPT-2 small MFU, with the Throughput callback ------------------------------------------------------
def gpt2_small_mfu(device: str, quick: bool = False, compile: bool = False, steps: int | None = None) -> dict:
    import lightning as L

    from zoo.tasks.language_model import LanguageModelTask
    from zoo.training.throughput import Throughput

    if device == "cuda":
        net = {"vocab_size": 50304, "block_size": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768}
        batch, precision, steps = 12, "bf16-mixed", steps or (12 if quick else 30)  # nanoGPT's micro-batch
    else:  # the same path, small
        net = {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64}
        batch, precision, steps = 4, "32-true", steps or 5
    tokens = torch.randint(0, net["vocab_size"], (batch * (steps + 1), net["block_size"] + 1))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=batch, shuffle=False
    )
    task = LanguageModelTask(net=dict(net), optimizer={"lr": 6e-4, "weight_decay": 0.1}, compile=compile)
    throughput = Throughput()
    seen: list[dict[str, float]] = []

    class Collect(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            if throughput.last and throughput.last is not (seen[-1] if seen else None):
                seen.append(throughput.last)

    trainer = L.Trainer(
        accelerator=device, devices=1, precision=precision, max_steps=steps, log_every_n_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[throughput, Collect()], default_root_dir=str(ROOT / "outputs" / "gpu_check"),
    )  # fmt: skip
    trainer.fit(task, train_dataloaders=data)
    timed = seen[2:] if len(seen) > 4 else seen  # the first steps after counting compile / warm up
    if not timed:
        return {"status": FAILED, "error": "no timed step"}
    median = {key: statistics.median(step[key] for step in timed if key in step) for key in timed[-1]}
    config = task.net.config
    per_token = 6 * task.net.num_parameters() + 12 * config.n_layer * config.block_size * config.n_embd
    estimate = per_token * batch * config.block_size
    result = {
        "status": OK, "model": net, "batch": batch, "precision": precision, "compile": compile,
        "timed_steps": len(timed), "tokens_per_s": median.get("train/tokens_per_s"),
        "step_ms": median.get("train/step_ms"), "mfu": median.get("train/mfu"),
        "flops_per_batch_counted": throughput.flops_per_batch, "flops_per_batch_nanogpt_estimate": estimate,
        "counted_over_estimate": throughput.flops_per_batch / estimate if throughput.flops_per_batch else None,
        "peak_flops": throughput.peak_flops, "peak_source": throughput.peak_source, "anchor": NANOGPT_ANCHOR,
    }  # fmt: skip
    return result


def gpt2_small(device: str, quick: bool = False) -> dict:
    """Eager, then compiled (nanoGPT's anchor is compiled)."""
    rows = {"eager": gpt2_small_mfu(device, quick)}
    if device == "cuda":
        try:
            rows["compiled"] = gpt2_small_mfu(device, quick, compile=True)
        except Exception as error:  # noqa: BLE001 (the eager row stands on its own)
            rows["compiled"] = {"status": FAILED, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    return {"status": OK if all(r["status"] == OK for r in rows.values()) else FAILED, "runs": rows}


# -- 4. position-bias score_mods against plain flex ----------------------------------------------------------
def score_mods_found() -> list[str]:
    """Names of score_mod builders in zoo's attention package (another branch adds ALiBi's and T5's)."""
    import importlib
    import pkgutil

    import zoo.attention

    found = []
    for module_info in pkgutil.walk_packages(zoo.attention.__path__, "zoo.attention."):
        module = importlib.import_module(module_info.name)
        names = [name for name, value in vars(module).items() if "score_mod" in name and callable(value)]
        found += [f"{module_info.name}.{name}" for name in names]
    return sorted(set(found))


def time_training_step(module: torch.nn.Module, x: torch.Tensor, repeats: int = 10) -> float:
    """Median seconds of forward + backward in bf16 autocast (CUDA)."""
    times = []
    for i in range(repeats + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16):
            module(x).float().sum().backward()
        torch.cuda.synchronize()
        if i >= 3:  # compile and warm-up first
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def bias_speed(device: str, quick: bool = False) -> dict:
    found = score_mods_found()
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA (FlexAttention score_mods)", "score_mods_found": found}
    length, dim, heads = (512 if quick else 2048), 512, 8
    rows_settings = {
        "full (SDPA)": {"variant": "full"},
        "plain flex (causal block mask, no score_mod)": {"variant": "local", "window": length, "backend": "flex"},
        "full + ALiBi": {"variant": "full", "position_bias": "alibi"},
        "full + T5": {"variant": "full", "position_bias": "t5"},
    }
    x = torch.randn(4, length, dim, device="cuda")
    rows = {}
    for name, settings in rows_settings.items():
        try:
            torch.manual_seed(0)
            module = MultiHeadAttention(dim, heads, AttentionConfig(**settings), causal=True).cuda()
            seconds = time_training_step(module, x)
            with torch.autocast("cuda", torch.bfloat16):
                kernels = kernels_seen(lambda m=module: m(x).float().sum().backward())
            rows[name] = {"ms": 1000 * seconds, "kernels": kernels}
        except Exception as error:  # noqa: BLE001
            rows[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    flex = rows.get("plain flex (causal block mask, no score_mod)", {}).get("ms")
    for row in rows.values():
        if "ms" in row and flex:
            row["vs_plain_flex"] = row["ms"] / flex
    bias_rows = [rows[name] for name in ("full + ALiBi", "full + T5")]
    on_flex = all("flex" in " ".join(row.get("kernels", [])) for row in bias_rows)
    note = (
        "the biases ran as FlexAttention score_mods"
        if on_flex
        else "score_mods not available: the biases did not run on FlexAttention (kernels in each row)"
    )
    failed = any("error" in row for row in rows.values())
    return {"status": FAILED if failed else OK, "length": length, "dim": dim, "heads": heads, "note": note,
            "score_mods_found": found, "rows": rows}  # fmt: skip


# -- 5. a 2-rank DDP step -------------------------------------------------------------------------------------
def ddp_skip_reason(device: str, gpus: int) -> str | None:
    """Why the DDP step cannot run here (None: it can)."""
    if device != "cuda":
        return "needs 2 CUDA GPUs (NCCL); this run is on the CPU"
    if gpus < 2:
        return f"{gpus} GPU visible; the 2-rank DDP step needs 2"
    return None


def _ddp_rank(rank: int, world: int, port: int, results: Any) -> None:
    import torch.distributed as dist

    from zoo.models.gpt import GPT, GPTConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = torch.nn.parallel.DistributedDataParallel(GPT(GPTConfig(vocab_size=256, block_size=64)).cuda(), [rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # different data per rank
    x = torch.randint(0, 256, (8, 64), device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
    loss.backward()
    optimizer.step()
    checksum = torch.stack([p.detach().float().sum() for p in model.parameters()]).sum()
    gathered = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(gathered, checksum)
    if rank == 0:
        results.put({"checksums": [g.item() for g in gathered], "loss": loss.item()})
    dist.destroy_process_group()


def ddp_step(device: str, quick: bool = False) -> dict:
    reason = ddp_skip_reason(device, torch.cuda.device_count() if device == "cuda" else 0)
    if reason:
        return {"status": SKIPPED, "note": reason}
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    mp.start_processes(_ddp_rank, args=(2, port, results), nprocs=2, join=True, start_method="spawn")
    result = results.get()
    equal = max(result["checksums"]) - min(result["checksums"]) <= 1e-6 * max(1.0, abs(result["checksums"][0]))
    return {"status": OK if equal else FAILED, "note": "ranks end with equal weights" if equal else "weights differ",
            **result}  # fmt: skip


# -- 6. bf16-mixed training through run.py -------------------------------------------------------------------
def check_bf16_training(device: str, quick: bool = False, out: Path | None = None) -> dict:
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA (trainer=gpu)"}
    run_dir = (out or ROOT / "outputs" / "gpu_check") / "bf16_gpt"
    steps = 100 if quick else 200
    command = [
        sys.executable, "run.py", "model=gpt", "trainer=gpu", f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps // 2}", "data.eval_batches=20", "model.net.n_layer=4",
        "model.net.n_embd=256", "data.block_size=256", "data.batch_size=32", f"hydra.run.dir={run_dir}",
        "print_config=false", "logger=csv",
    ]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        return {"status": FAILED, "error": process.stderr[-2000:]}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    loss = metrics.get("val/loss", float("nan"))
    logged = {key: metrics.get(key) for key in ("train/mfu", "train/tokens_per_s", "train/step_ms")}
    ok = loss == loss and loss < 4.0
    return {"status": OK if ok else FAILED, "val_loss": loss, "wall_s": wall, "logged": logged}


# -- extras -----------------------------------------------------------------------------------------------------
def attention_kernels(device: str, quick: bool = False, length: int = 4096) -> dict:
    """variant -> dtype -> the attention kernels its forward ran, from the profiler's op names."""
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA"}
    sys.path.insert(0, str(ROOT / "experiments"))
    from attention_benchmark import BARE, ROWS, build_rows  # noqa: PLC0415 (experiments is not a package)

    report: dict = {}
    for dtype in (torch.bfloat16, torch.float32):
        rows = build_rows(torch.device("cuda"), length, dtype)
        for name in ROWS:
            shape = (3, 1, 4, length, 64) if name in BARE else (1, length, 256)
            x = torch.randn(shape, device="cuda", dtype=dtype)
            with torch.no_grad():
                rows[name](x)  # compile / warm up outside the profile
                seen = kernels_seen(lambda row=rows[name], x=x: row(x))
            report.setdefault(name, {})[str(dtype).removeprefix("torch.")] = seen or ["none (no fused op)"]
    return {"status": OK, "rows": report}


def run_attention_benchmark(device: str, quick: bool = False) -> dict:
    """experiments/attention_benchmark.py on CUDA, quick, in bf16 and fp32; its markdown goes to results/."""
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA"}
    done = {}
    for dtype in ("bfloat16", "float32"):
        out = ROOT / "outputs" / "gpu_check" / f"attention_{dtype}"
        command = [sys.executable, "experiments/attention_benchmark.py", "--quick", "--dtype", dtype, "--out", str(out)]
        process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        done[dtype] = process.returncode == 0
        if done[dtype]:
            target = RESULTS / f"gpu_attention_benchmark_{dtype}.md"
            target.write_text((out / "attention_benchmark.md").read_text())
    return {"status": OK if all(done.values()) else FAILED, "written": done}


def rnn_step_times(device: str = "cuda", lengths: tuple[int, ...] | None = None) -> dict:
    """Time per training step against sequence length, RNN rows and the Transformer at one width, with the fitted
    exponents (experiments/rnn_vs_transformer.py's sweep; runs on any device, e.g. device="cpu")."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from rnn_vs_transformer import LENGTHS, ROWS, step_time_sweep  # noqa: PLC0415 (experiments is not a package)

    return step_time_sweep(list(ROWS), lengths or LENGTHS, device=device)


def rnn_section(device: str, quick: bool = False) -> dict:
    if device != "cuda":
        return {"status": SKIPPED, "note": "needs CUDA"}
    return {"status": OK, **rnn_step_times(device)}


# -- the run and its report --------------------------------------------------------------------------------------
SECTIONS: dict[str, Callable[..., dict]] = {  # the order they run in: the variants, with their own time limit, last
    "flash": check_flash,
    "gpt2_small": gpt2_small,
    "bias_speed": bias_speed,
    "ddp": ddp_step,
    "bf16_training": check_bf16_training,
    "variants": compare_variants,
}
EXTRAS: dict[str, Callable[..., dict]] = {
    "attention_kernels": attention_kernels,
    "attention_benchmark": run_attention_benchmark,
    "rnn_step_times": rnn_section,
}
TITLES = {
    "flash": "SDPA flash kernel, full causal attention, bf16 (asserted)",
    "variants": "every registered variant on the device = its CPU reference",
    "gpt2_small": "GPT-2 small bf16 training: tokens/s and MFU (Throughput callback)",
    "bias_speed": "ALiBi / T5 score_mods vs plain flex",
    "ddp": "2-rank DDP training step",
    "bf16_training": "`python run.py model=gpt trainer=gpu`, bf16-mixed",
    "attention_kernels": "kernel of each attention_benchmark row",
    "attention_benchmark": "attention_benchmark.py on CUDA",
    "rnn_step_times": "RNN vs Transformer step-time sweep",
}


def run_sections(sections: dict[str, Callable[..., dict]], device: str, quick: bool, budget: float) -> dict:
    """Each section's result with its wall time; one past the budget is skipped, one that raises is FAILED."""
    start = time.perf_counter()
    results = {}
    for name, section in sections.items():
        spent = time.perf_counter() - start
        if spent > budget:
            results[name] = {"status": SKIPPED, "note": f"over the time budget ({spent:.0f} s of {budget:.0f} s spent)"}
            continue
        began = time.perf_counter()
        try:
            results[name] = section(device, quick)
        except Exception as error:  # noqa: BLE001 (the report says which section failed and how)
            results[name] = {"status": FAILED, "error": f"{type(error).__name__}: {error}",
                             "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        results[name]["seconds"] = round(time.perf_counter() - began, 1)
        print(f"{name}: {results[name]['status']} ({results[name]['seconds']} s)", flush=True)
    return results


def summary(name: str, result: dict) -> str:
    """One line of what a section found."""
    if result["status"] == SKIPPED or "error" in result:
        return result.get("note") or result.get("error", "").splitlines()[0][:200]
    if name == "flash":
        return ", ".join(
            f"{case}: max diff vs fp32 {c['max_abs_diff_vs_fp32']:.1e}" if "max_abs_diff_vs_fp32" in c else case
            for case, c in result["cases"].items()
        )
    if name == "variants":
        bad = [case for case, row in result["cases"].items() if row["ok"] is False]
        left = sum(row["ok"] is None for row in result["cases"].values())
        equal = len(result["cases"]) - len(bad) - left
        return (
            f"{equal} of {len(result['cases'])} cases equal"
            + (f"; not: {', '.join(bad)}" if bad else "")
            + (f"; {left} not run (time)" if left else "")
        )
    if name == "gpt2_small":
        parts = []
        for run, row in result["runs"].items():
            if row["status"] != OK:
                parts.append(f"{run}: {row.get('error', 'failed')[:100]}")
                continue
            mfu = f"MFU {row['mfu']:.1%}" if row.get("mfu") is not None else "MFU unknown"
            parts.append(f"{run}: {row['tokens_per_s']:,.0f} tokens/s, {mfu}")
        return "; ".join(parts)
    if name == "bias_speed":
        return result["note"]
    if name == "ddp":
        return result["note"]
    if name == "bf16_training":
        mfu = result["logged"].get("train/mfu")
        return f"val loss {result['val_loss']:.3f}" + (f", the run logged train/mfu {mfu:.1%}" if mfu else "")
    return ""


def render_markdown(report: dict) -> str:
    """The results page of one run."""
    head = report["environment"]
    lines = [
        "# GPU check (`python experiments/gpu_check.py`)", "",
        f"{head['device_name']}, torch {head['torch']}, {head['date']}, {head['wall_s']:.0f} s"
        + (" (--quick)" if head["quick"] else "") + ".", "",
        "| check | status | result |", "|---|---|---|",
        *(f"| {TITLES.get(name, name)} | {result['status']} | {summary(name, result)} |"
          for name, result in report["sections"].items()),
    ]  # fmt: skip
    variants = report["sections"].get("variants", {})
    if variants.get("cases"):
        lines += [
            "", f"## Variants (n={variants['length']}, dim {variants['dim']}, 4 heads; {variants['note']})", "",
            "| case | equal | max diff output | max diff gradients | kernels |", "|---|---|---|---|---|",
        ]  # fmt: skip
        for case, row in variants["cases"].items():
            if "error" in row or "note" in row:
                lines.append(f"| {case} | {'no' if 'error' in row else '-'} | {row.get('error') or row['note']} | | |")
                continue
            lines.append(
                f"| {case} | {'yes' if row['ok'] else 'NO'} | {row['max_abs_diff_output']:.1e} | "
                f"{row['max_abs_diff_grads']:.1e} | {', '.join(row['kernels']) or '-'} |"
            )
    for run, row in report["sections"].get("gpt2_small", {}).get("runs", {}).items():
        if row.get("status") != OK:
            continue
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "unknown"
        lines += [
            "", f"## GPT-2 small, {run} ({row['precision']}, batch {row['batch']}, {row['timed_steps']} timed steps)",
            "", f"- {row['tokens_per_s']:,.0f} tokens/s, step {row['step_ms']:.1f} ms, MFU {mfu} of "
            f"{row['peak_flops'] or 0:.3g} FLOP/s ({row['peak_source']})",
            f"- FLOPs per batch: counted {row['flops_per_batch_counted'] or 0:.4g}, nanoGPT's estimate "
            f"{row['flops_per_batch_nanogpt_estimate']:.4g}",
            f"- anchor: {row['anchor']}",
        ]  # fmt: skip
    bias = report["sections"].get("bias_speed", {})
    if bias.get("rows"):
        lines += ["", f"## Position biases (n={bias['length']}, dim {bias['dim']}, {bias['heads']} heads, causal, "
                  "bf16, forward + backward)", "", f"{bias['note']}; score_mod builders found: "
                  f"{', '.join(bias['score_mods_found']) or 'none'}.", "",
                  "| row | ms | vs plain flex | kernels |", "|---|---|---|---|"]  # fmt: skip
        for name, row in bias["rows"].items():
            if "error" in row:
                lines.append(f"| {name} | {row['error']} | | |")
                continue
            ratio = f"{row['vs_plain_flex']:.2f}x" if "vs_plain_flex" in row else "-"
            lines.append(f"| {name} | {row['ms']:.2f} | {ratio} | {', '.join(row['kernels']) or '-'} |")
    return "\n".join(lines) + "\n"


NOT_RUN = """# GPU check (`python experiments/gpu_check.py`)

Not run yet: it needs a CUDA GPU, and none has run it. On a machine with one, `python experiments/gpu_check.py`
(under 8 minutes) replaces this page and gpu_check.json with its results: the flash SDPA path, every attention
variant against its CPU reference, the ALiBi / T5 score_mods against plain flex, GPT-2 small bf16 tokens/s and MFU,
a 2-rank DDP step (2 GPUs), and a short bf16-mixed run of run.py.
"""


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    page, record = out / "gpu_check.md", out / "gpu_check.json"
    page.write_text(render_markdown(report))
    record.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return page, record


def environment(device: str, quick: bool, wall: float) -> dict:
    name = torch.cuda.get_device_name() if device == "cuda" else cpu_model()[0]
    return {"device": device, "device_name": name, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "date": f"{datetime.now():%Y-%m-%d %H:%M}", "quick": quick, "wall_s": wall}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same code, small")
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer steps")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds after which no section starts")
    parser.add_argument("--extras", action="store_true", help="also the attention benchmark and RNN sweep on CUDA")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS | EXTRAS), help="run these sections only")
    parser.add_argument("--out", type=Path, help="where the page and JSON go (default: experiments/results on "
                        "CUDA, outputs/gpu_check on the CPU)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("experiments/gpu_check.py needs a CUDA GPU; none is visible (use --device cpu --quick to try it here)")
    sections = {**SECTIONS, **(EXTRAS if args.extras else {})}
    if args.only:
        sections = {name: section for name, section in (SECTIONS | EXTRAS).items() if name in args.only}
    start = time.perf_counter()
    results = run_sections(sections, args.device, args.quick, args.budget)
    report = {"environment": environment(args.device, args.quick, time.perf_counter() - start), "sections": results}
    out = args.out or (RESULTS if args.device == "cuda" else ROOT / "outputs" / "gpu_check")
    page, _ = write_report(report, out)
    print(page.read_text())
    return 1 if any(result["status"] == FAILED for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
