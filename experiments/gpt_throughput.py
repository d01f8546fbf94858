"""Training throughput of zoo's GPT: through Lightning vs the same model in a plain PyTorch loop vs
Hugging Face GPT-2 of the same size in that loop, side by side in one process; plus MFU against a
measured matmul peak.

    python experiments/gpt_throughput.py                      # nanoGPT's shakespeare_char CPU shape
    python experiments/gpt_throughput.py --n-layer 6 --n-embd 384 --block-size 256 --steps 20

Every path trains the same shape with the same recipe (AdamW with weight-decay groups, warmup + cosine
schedule, gradient clipping at 1.0, random blocks drawn like nanoGPT) for `--steps` timed steps after
`--warmup` untimed ones. Paths take turns for `--rounds` rounds; the median tokens/s per path is reported,
so background load on a shared machine hits all paths alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from zoo.data.text import RandomBlocks
from zoo.models.gpt import GPT, GPTConfig
from zoo.tasks.language_model import LanguageModelTask
from zoo.tasks.optim import build_optimizer, lr_multiplier
from zoo.training.precision import mixed_precision_plugin


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--vocab-size", type=int, default=65)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per path and round")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face GPT-2")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=["32-true", "bf16-mixed"],
        default=["32-true", "bf16-mixed"],
        help="every path in each: 32-true (fp32) and bf16-mixed (torch.autocast(bfloat16), Lightning's flag)",
    )
    parser.add_argument("--unfused", action="store_true", help="Adam's per-tensor loop instead of the fused kernel")
    parser.add_argument("--compile", action="store_true", help="also every path under torch.compile (inductor)")
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    return parser.parse_args()


def measure_matmul_peak(size: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of a square fp32 matmul: the peak MFU is measured against (best of `repeats`)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def flops_per_token(model: GPT) -> float:
    """6 N for the weights' forward + backward, plus 12 L T C for attention scores and mixing (PaLM,
    Chowdhery et al. 2022, appendix B; nanoGPT's estimate_mfu)."""
    config = model.config
    return 6 * model.num_parameters() + 12 * config.n_layer * config.block_size * config.n_embd


def plain_loop(model: torch.nn.Module, logits_of: Callable, batches, args, total_steps: int, precision: str) -> float:
    """The training loop without Lightning; returns tokens/s over the timed steps."""
    fused = False if args.unfused else None
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), fused=fused)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier("cosine", total_steps, 100, 0.1))
    model.train()
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        x, y = next(batches)
        with autocast:
            logits = logits_of(model, x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return args.steps * args.batch_size * args.block_size / (time.perf_counter() - start)


def compiled_plain_loop(model: torch.nn.Module, logits_of: Callable, batches, args, total_steps: int, precision: str):
    """plain_loop with the forward under torch.compile (inductor), compiled during the untimed warm-up steps."""
    compiled = torch.compile(model)
    return plain_loop(model, lambda _, x: logits_of(compiled, x), batches, args, total_steps, precision)


class StepTimer(L.Callback):
    """Wall time from the first timed step's start to the last step's end (data loading included, as in
    the plain loop)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end = warmup, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.end = time.perf_counter()


def lightning_path(net: dict, loader: DataLoader, args, precision: str, compile: bool = False) -> float:
    """zoo's LanguageModelTask under a Lightning Trainer (compile: the network under torch.compile, compiled
    during the untimed warm-up steps)."""
    task = LanguageModelTask(
        net=net,
        compile=compile,
        optimizer={"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], **({"fused": False} if args.unfused else {})},
        scheduler={"warmup_steps": 100, "min_lr": 1e-4},
        sample={"max_new_tokens": 0},
    )
    timer = StepTimer(args.warmup)
    plugins = [mixed_precision_plugin(precision, "cpu")] if precision != "32-true" else []
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.warmup + args.steps, gradient_clip_val=1.0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[timer], plugins=plugins,
    )  # fmt: skip
    trainer.fit(task, train_dataloaders=loader)
    return args.steps * args.batch_size * args.block_size / (timer.end - timer.start)


def path_name(path: str, precision: str) -> str:
    return f"{path}, {precision}"


def ratios(median: dict[str, float]) -> dict[str, float]:
    """The ratios #19 reads: Lightning's overhead (fp32), the default precision (bf16-mixed) against zoo's own
    fp32 eager step, and zoo's fastest Lightning path against Hugging Face's fastest precision."""
    out = {}
    fp32 = median.get(path_name("zoo GPT, Lightning", "32-true"))
    plain = median.get(path_name("zoo GPT, plain loop", "32-true"))
    bf16 = median.get(path_name("zoo GPT, Lightning", "bf16-mixed"))
    if fp32 and plain:
        out["Lightning / plain loop, fp32"] = fp32 / plain
    if fp32 and bf16:
        out["Lightning bf16-mixed / Lightning fp32"] = bf16 / fp32
    ours = [value for name, value in median.items() if name.startswith("zoo GPT, Lightning")]
    if fp32 and ours:
        out["zoo Lightning (fastest) / zoo Lightning fp32 eager"] = max(ours) / fp32
    theirs = [value for name, value in median.items() if name.startswith("HF GPT-2")]
    if ours and theirs:
        out["zoo Lightning (fastest) / HF GPT-2 (fastest)"] = max(ours) / max(theirs)
    return out


def main() -> None:
    args = parse_args()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no banner per Lightning run
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = np.random.default_rng(0).integers(0, args.vocab_size, 1_000_000).astype(np.uint16)
    net = dict(
        vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
        n_embd=args.n_embd, dropout=0.0, bias=True,
    )  # fmt: skip
    total_steps = args.warmup + args.steps

    def batches():
        return iter(RandomBlocks(tokens, args.block_size, args.batch_size, seed=0))

    hf_config = GPT2LMHeadModel = None
    if not args.no_hf:
        try:
            from transformers import GPT2Config, GPT2LMHeadModel

            hf_config = GPT2Config(
                vocab_size=args.vocab_size, n_positions=args.block_size, n_embd=args.n_embd, n_layer=args.n_layer,
                n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            )  # fmt: skip
        except ImportError:
            print("transformers is not installed: skipping Hugging Face GPT-2")

    def loader() -> DataLoader:
        return DataLoader(RandomBlocks(tokens, args.block_size, args.batch_size, seed=0), batch_size=None)

    paths: dict[str, Callable[[], float]] = {}
    for precision in args.precisions:
        paths[path_name("zoo GPT, plain loop", precision)] = lambda p=precision: plain_loop(
            GPT(GPTConfig(**net)), lambda model, x: model(x), batches(), args, total_steps, p
        )
        paths[path_name("zoo GPT, Lightning", precision)] = lambda p=precision: lightning_path(net, loader(), args, p)
        if args.compile:
            paths[path_name("zoo GPT, plain loop, compiled", precision)] = lambda p=precision: compiled_plain_loop(
                GPT(GPTConfig(**net)), lambda model, x: model(x), batches(), args, total_steps, p
            )
            paths[path_name("zoo GPT, Lightning, compiled", precision)] = lambda p=precision: lightning_path(
                net, loader(), args, p, compile=True
            )
        if hf_config is not None:
            paths[path_name("HF GPT-2, plain loop", precision)] = lambda p=precision: plain_loop(
                GPT2LMHeadModel(hf_config), lambda model, x: model(x).logits, batches(), args, total_steps, p
            )
            if args.compile:
                paths[path_name("HF GPT-2, plain loop, compiled", precision)] = lambda p=precision: compiled_plain_loop(
                    GPT2LMHeadModel(hf_config), lambda model, x: model(x).logits, batches(), args, total_steps, p
                )

    L.seed_everything(0, verbose=False)
    peak = measure_matmul_peak()
    results: dict[str, list[float]] = {name: [] for name in paths}
    width = max(len(name) for name in paths)
    for round_index in range(args.rounds):
        for name, run in paths.items():
            results[name].append(run())
            print(f"round {round_index + 1}: {name:<{width}} {results[name][-1]:>10,.0f} tokens/s", flush=True)

    model = GPT(GPTConfig(**net))
    per_token = flops_per_token(model)
    median = {name: statistics.median(values) for name, values in results.items()}
    print(
        f"\nGPT n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} block={args.block_size} "
        f"batch={args.batch_size} vocab={args.vocab_size}: {model.num_parameters() / 1e6:.2f}M parameters, "
        f"{per_token / 1e6:.1f} MFLOP/token{', unfused Adam' if args.unfused else ''}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"matmul peak (fp32 2048^2): {peak / 1e9:.0f} GFLOP/s\n")
    print(f"{'path':<{width}} {'tokens/s':>10} {'ms/step':>8} {'MFU':>6}  rounds")
    for name, value in median.items():
        step_ms = 1000 * args.batch_size * args.block_size / value
        rounds = ", ".join(f"{v:,.0f}" for v in results[name])
        print(f"{name:<{width}} {value:>10,.0f} {step_ms:>8.1f} {value * per_token / peak:>6.1%}  {rounds}")
    print()
    for label, value in ratios(median).items():
        print(f"{label}: {value:.3f}x")
    if args.json:
        record = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.processor()
            or platform.machine(), "threads": torch.get_num_threads(), "args": vars(args),
            "peak_flops": peak, "flops_per_token": per_token, "tokens_per_s": results, "ratios": ratios(median),
        }  # fmt: skip
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    main()
