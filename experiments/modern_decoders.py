"""Benchmarks of the modern-decoder features (issue 50), printed as markdown rows for
experiments/results/modern_decoders.md:

    python experiments/modern_decoders.py checkpointing   # training-step peak memory with / without
    python experiments/modern_decoders.py lora            # trainable parameters and step time, LoRA vs full

checkpointing: one training step (forward, backward, AdamW) of a Llama-shaped GPT at block 1024, each setting in
a fresh subprocess; "activations" is the bytes autograd saves for the backward (saved-tensor hooks, exact), "peak
RSS" the growth of the process' peak resident memory during the step (what the machine must hold), once with
glibc malloc as it comes and once with its mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_): glibc raises
that threshold each time a large block is freed, so later blocks of a few MiB come from the heap and stay
resident after their tensors die; fixed, every such block is returned at once and the peak RSS follows the
tensors alive at once.
lora: the same model's step time with every weight trained and with rank-8 adapters on the attention and MLP
projections only (model.lora), median of a few steps.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.models.gpt import GPT, GPTConfig  # noqa: E402


def llama(block_size: int, checkpointing: bool = False, **overrides) -> GPT:
    config = dict(vocab_size=65, block_size=block_size, n_layer=6, n_head=6, n_embd=384, bias=False, norm="rmsnorm",
                  mlp="swiglu", tie_weights=False, attention={"rope": True}, checkpointing=checkpointing)  # fmt: skip
    config.update(overrides)
    return GPT(GPTConfig(**config))


def one_step(block_size: int, batch: int, checkpointing: bool, n_layer: int = 6, n_embd: int = 384) -> dict:
    """Peak memory of one training step, measured in this process (run in a fresh one per setting)."""
    torch.manual_seed(0)
    model = llama(block_size, checkpointing, n_layer=n_layer, n_embd=n_embd).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 65, (batch, block_size))
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    # Optimiser state exists before the measured step, as in any step but the first.
    model(idx[:, :8]).float().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
    loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"saved_mib": saved[0] / 2**20, "peak_rss_mib": (after - before) / 1024, "seconds": seconds}


# glibc malloc's settings per run: as it comes, and with large blocks always mapped (returned to the system when freed).
ALLOCATORS = {"glibc default": {}, "mmap threshold 1 MiB": {"MALLOC_MMAP_THRESHOLD_": str(2**20)}}


def checkpointing(args: argparse.Namespace) -> None:
    print(f"| setting (block {args.block_size}, batch {args.batch}) | malloc | activations saved (MiB) | peak RSS "
          "growth (MiB) | step (s) |")  # fmt: skip
    print("|---|---|---|---|---|")
    rows = {}
    for allocator, env in ALLOCATORS.items():
        for enabled in (False, True):
            sizes = (args.block_size, args.batch, int(enabled), args.n_layer, args.n_embd)
            command = [sys.executable, __file__, "step", *(str(size) for size in sizes)]
            result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT,
                                    env={**os.environ, **env})  # fmt: skip
            row = rows[allocator, enabled] = json.loads(result.stdout.strip().splitlines()[-1])
            name = "checkpointing=true" if enabled else "plain"
            print(f"| {name} | {allocator} | {row['saved_mib']:.1f} | {row['peak_rss_mib']:.1f} | "
                  f"{row['seconds']:.2f} |")  # fmt: skip
    print()
    for allocator in ALLOCATORS:
        plain, checkpointed = rows[allocator, False], rows[allocator, True]
        print(f"{allocator}: activations {plain['saved_mib'] / checkpointed['saved_mib']:.1f}x lower, peak RSS "
              f"growth {plain['peak_rss_mib'] / max(checkpointed['peak_rss_mib'], 1e-9):.1f}x lower")  # fmt: skip


def lora(args: argparse.Namespace) -> None:
    from zoo.nn.lora import LoRAConfig, add_lora

    print(f"| setting (block {args.block_size}, batch {args.batch}) | trainable parameters | of all | step (s) |")
    print("|---|---|---|---|")
    for rank in (None, 8):
        torch.manual_seed(0)
        model = llama(args.block_size, n_layer=args.n_layer, n_embd=args.n_embd).train()
        if rank:
            add_lora(model, LoRAConfig(rank=rank))
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-3)
        idx = torch.randint(0, 65, (args.batch, args.block_size))
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            logits = model(idx)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - start)
        count, total = sum(p.numel() for p in trainable), sum(p.numel() for p in model.parameters())
        name = f"LoRA rank {rank} (attention + MLP)" if rank else "full fine-tuning"
        print(f"| {name} | {count:,} | {count / total:.2%} | {statistics.median(times[1:]):.3f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "step":
        block_size, batch, enabled, n_layer, n_embd = (int(value) for value in sys.argv[2:7])
        print(json.dumps(one_step(block_size, batch, bool(enabled), n_layer, n_embd)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=["checkpointing", "lora"])
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384, help="a multiple of the 6 heads")
    args = parser.parse_args()
    torch.set_num_threads(2)
    {"checkpointing": checkpointing, "lora": lora}[args.benchmark](args)


if __name__ == "__main__":
    main()
