"""GPU checks: the flash SDPA path, bf16-mixed training through run.py, and GPT MFU at GPT-2 small width.

    python experiments/gpu_check.py            # needs a CUDA GPU; writes experiments/results/gpu_check.md

1. Flash: zoo's full causal attention (with and without RoPE) runs with PyTorch restricted to the flash
   kernel (sdpa_kernel(FLASH_ATTENTION): an error if any call would fall back) in bf16, and agrees with the
   math kernel in fp32 to bf16 precision.
2. bf16-mixed: `python run.py model=gpt trainer=gpu` trains a small GPT for 200 steps; the validation loss
   must be finite and fall.
3. MFU: GPT-2 small shape (12 layers, 12 heads, 768 wide, block 1024, vocabulary 50304) trained with bf16
   autocast and fused AdamW; tokens/s and MFU against a measured bf16 matmul peak (and against the GPU's
   dense bf16 datasheet peak when known).
4. Attention on CUDA: which kernel each variant of experiments/attention_benchmark.py runs (the SDPA backend
   or FlexAttention, read from the profiler's op names; backend auto), and that benchmark itself on CUDA in
   bf16 and fp32 (experiments/results/gpu_attention_benchmark_{bfloat16,float32}.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.attention import MultiHeadAttention  # noqa: E402
from zoo.models.gpt import GPT, GPTConfig  # noqa: E402

DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}  # dense TFLOP/s


def check_flash() -> dict:
    torch.manual_seed(0)
    results = {}
    for rope in (False, True):
        module = MultiHeadAttention(768, 12, "full", causal=True, rope=rope).cuda()
        x = torch.randn(4, 1024, 768, device="cuda")
        with torch.no_grad():
            reference = module(x)  # fp32, any kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", torch.bfloat16):
                flash = module(x)
        gap = (flash.float() - reference).abs().max().item()
        results[f"rope={rope}"] = {"ran_on_flash_only": True, "max_abs_diff_vs_fp32": gap, "ok": gap < 5e-2}
    return results


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


def attention_kernels(length: int = 4096) -> dict:
    """variant -> dtype -> the attention kernels its forward ran, from the profiler's op names."""
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
                with torch.profiler.profile() as prof:
                    rows[name](x)
                    torch.cuda.synchronize()
            seen = {label for event in prof.events() for op, label in KERNEL_OPS.items() if op in event.name}
            report.setdefault(name, {})[str(dtype).removeprefix("torch.")] = sorted(seen) or ["none (no fused op)"]
    return report


def run_attention_benchmark() -> dict:
    """experiments/attention_benchmark.py on CUDA, quick, in bf16 and fp32; its markdown goes to results/."""
    done = {}
    for dtype in ("bfloat16", "float32"):
        out = ROOT / "outputs" / "gpu_check" / f"attention_{dtype}"
        command = [sys.executable, "experiments/attention_benchmark.py", "--quick", "--dtype", dtype, "--out", str(out)]
        process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        done[dtype] = process.returncode == 0
        if done[dtype]:
            target = ROOT / "experiments" / "results" / f"gpu_attention_benchmark_{dtype}.md"
            target.write_text((out / "attention_benchmark.md").read_text())
        else:
            print(process.stderr[-3000:], flush=True)
    return done


def check_bf16_training(out: Path) -> dict:
    run_dir = out / "bf16_gpt"
    command = [
        sys.executable, "run.py", "model=gpt", "trainer=gpu", "trainer.max_steps=200", "trainer.val_check_interval=100",
        "data.eval_batches=20", "model.net.n_layer=4", "model.net.n_embd=256", "data.block_size=256",
        "data.batch_size=32", f"hydra.run.dir={run_dir}", "print_config=false", "logger=csv",
    ]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        return {"ok": False, "error": process.stderr[-2000:]}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    loss = metrics.get("val/loss", float("nan"))
    return {"ok": bool(loss == loss and loss < 4.0), "val_loss": loss, "wall_s": wall}


def matmul_peak(dtype: torch.dtype, size: int = 8192, repeats: int = 20) -> float:
    a, b = torch.randn(size, size, device="cuda", dtype=dtype), torch.randn(size, size, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def gpt2_small_mfu(steps: int = 30, warmup: int = 5, batch: int = 16) -> dict:
    config = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.0)
    model = GPT(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    x = torch.randint(0, 50304, (batch, 1024), device="cuda")
    y = torch.randint(0, 50304, (batch, 1024), device="cuda")
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    tokens_per_s = steps * batch * 1024 / (time.perf_counter() - start)
    per_token = 6 * model.num_parameters() + 12 * config.n_layer * config.block_size * config.n_embd
    peak = matmul_peak(torch.bfloat16)
    name = torch.cuda.get_device_name()
    datasheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
    return {
        "parameters": model.num_parameters(), "tokens_per_s": tokens_per_s, "measured_bf16_peak": peak,
        "mfu_vs_measured_peak": tokens_per_s * per_token / peak,
        "mfu_vs_datasheet": tokens_per_s * per_token / datasheet if datasheet else None,
    }  # fmt: skip


def rnn_step_times(device: str = "cuda", lengths: tuple[int, ...] | None = None) -> dict:
    """Time per training step against sequence length, RNN rows and the Transformer at one width, with the fitted
    exponents (experiments/rnn_vs_transformer.py's sweep; runs on any device, e.g. device="cpu")."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from rnn_vs_transformer import LENGTHS, ROWS, step_time_sweep  # noqa: PLC0415 (experiments is not a package)

    return step_time_sweep(list(ROWS), lengths or LENGTHS, device=device)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("experiments/gpu_check.py needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    out = ROOT / "outputs" / "gpu_check" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": f"{datetime.now():%Y-%m-%d}"}
    report["flash"] = check_flash()
    print("flash:", report["flash"], flush=True)
    report["bf16_training"] = check_bf16_training(out)
    print("bf16 training:", report["bf16_training"], flush=True)
    report["gpt2_small"] = gpt2_small_mfu()
    print("GPT-2 small:", report["gpt2_small"], flush=True)
    report["attention_kernels"] = attention_kernels()
    print("attention kernels:", report["attention_kernels"], flush=True)
    report["attention_benchmark"] = run_attention_benchmark()
    print("attention benchmark written:", report["attention_benchmark"], flush=True)
    report["rnn_step_times"] = rnn_step_times()
    print("RNN vs Transformer step-time exponents:", report["rnn_step_times"]["exponents"], flush=True)
    g = report["gpt2_small"]
    lines = [
        "# GPU check (`python experiments/gpu_check.py`)", "",
        f"{report['gpu']}, torch {report['torch']}, {report['date']}.", "",
        "| check | result |", "|---|---|",
        *(f"| flash SDPA, full causal, {k} | {'ok' if v['ok'] else 'FAILED'} (max diff vs fp32 "
          f"{v['max_abs_diff_vs_fp32']:.1e}) |" for k, v in report["flash"].items()),
        f"| bf16-mixed training via run.py | {'ok' if report['bf16_training']['ok'] else 'FAILED'} "
        f"(val loss {report['bf16_training'].get('val_loss', float('nan')):.3f}) |",
        f"| GPT-2 small ({g['parameters'] / 1e6:.0f}M) bf16 training | {g['tokens_per_s']:,.0f} tokens/s, MFU "
        f"{g['mfu_vs_measured_peak']:.1%} of the measured bf16 matmul peak ({g['measured_bf16_peak'] / 1e12:.0f} "
        f"TFLOP/s)" + (f", {g['mfu_vs_datasheet']:.1%} of the datasheet peak |" if g["mfu_vs_datasheet"] else " |"),
        "", "## Attention kernel per benchmark row (backend auto, n=4096, forward)", "",
        "| row | bfloat16 | float32 |", "|---|---|---|",
        *(f"| {row} | {', '.join(k['bfloat16'])} | {', '.join(k['float32'])} |"
          for row, k in report["attention_kernels"].items()),
        "", "Attention benchmark on CUDA: " + ", ".join(
            f"[{d}](gpu_attention_benchmark_{d}.md)" + ("" if ok else " (FAILED)")
            for d, ok in report["attention_benchmark"].items()),
        "", "Step time vs length, fitted exponents (experiments/rnn_vs_transformer.py's sweep): " + ", ".join(
            f"{row} {k:.2f}" for row, k in report["rnn_step_times"]["exponents"].items() if k is not None),
    ]  # fmt: skip
    path = ROOT / "experiments" / "results" / "gpu_check.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(path.read_text())
    ok = all(v["ok"] for v in report["flash"].values()) and report["bf16_training"]["ok"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
