"""Images/s of zoo's ViT against timm's VisionTransformer of the same size, side by side in one process.

    python experiments/vit_throughput.py                    # ViT-Tiny width (192, 12 layers, 3 heads), 64x64, patch 8
    python experiments/vit_throughput.py --image-size 224 --patch-size 16 --batch-size 16 --steps 5

Both models are built with the same shape (class token, pre-norm blocks, GELU MLP of 4x width, LayerNorm
eps 1e-6, no dropout), and timm's weights are copied into zoo's model first, so the two compute the same
function (the script checks the logits agree). Two paths per model and precision (`--precisions`: fp32, and
bf16-mixed, i.e. torch.autocast(bfloat16) as Lightning's flag runs it): training (forward + backward + AdamW
step on random images and labels) and inference (forward under no_grad). The paths take turns for `--rounds`
rounds and the median images/s per path is reported, so background load hits all alike. Ratios: zoo / timm at
each precision, and zoo's fastest precision against timm's fastest (what a user of either gets at best).
Without timm installed (`pip install -e '.[bench]'`) only zoo's figures are printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

from zoo.models.vit import ViT, ViTConfig

PRECISIONS = ("32-true", "bf16-mixed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per path and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
        help="every path in each: 32-true (fp32) and bf16-mixed (torch.autocast(bfloat16))",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    return parser.parse_args(argv)


def timm_model(args: argparse.Namespace) -> torch.nn.Module | None:
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        return None
    return VisionTransformer(
        img_size=args.image_size, patch_size=args.patch_size, in_chans=3, num_classes=args.classes,
        embed_dim=args.dim, depth=args.depth, num_heads=args.heads, mlp_ratio=4.0, qkv_bias=True,
        class_token=True, global_pool="token",
    )  # fmt: skip


TIMM_RENAMES = (("patch_embed.proj.", "patch_embed."), (".attn.qkv.", ".self_attn.in_proj."),
                (".attn.proj.", ".self_attn.out_proj."))  # fmt: skip


def copy_timm_into_zoo(timm_vit: torch.nn.Module, zoo_vit: ViT) -> None:
    """timm's weights into zoo's ViT: the same network, three names differ."""
    state = {}
    for key, value in timm_vit.state_dict().items():
        for old, new in TIMM_RENAMES:
            key = key.replace(old, new)
        state[key] = value
    zoo_vit.load_state_dict(state)


def autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")


def train_speed(model: torch.nn.Module, args: argparse.Namespace, precision: str = "32-true") -> float:
    """Training images/s: forward, cross-entropy, backward, AdamW step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(args.classes, (args.batch_size,), generator=generator)
    model.train()
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        with autocast(precision):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return args.steps * args.batch_size / (time.perf_counter() - start)


@torch.no_grad()
def inference_speed(model: torch.nn.Module, args: argparse.Namespace, precision: str = "32-true") -> float:
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    model.eval()
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        with autocast(precision):
            model(images)
    return args.steps * args.batch_size / (time.perf_counter() - start)


def ratios(median: dict[str, float], precisions: list[str]) -> dict[str, float]:
    """zoo / timm images/s per path: at each precision, and zoo's fastest precision against timm's fastest."""
    out = {}
    for kind in ("train", "inference"):
        for p in precisions:
            out[f"{kind}, {p}"] = median[f"zoo ViT, {kind}, {p}"] / median[f"timm ViT, {kind}, {p}"]
        best = {name: max(median[f"{name}, {kind}, {p}"] for p in precisions) for name in ("zoo ViT", "timm ViT")}
        out[f"{kind}, fastest"] = best["zoo ViT"] / best["timm ViT"]
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=args.image_size, patch_size=args.patch_size, in_channels=3, num_classes=args.classes,
        dim=args.dim, depth=args.depth, num_heads=args.heads,
    )  # fmt: skip
    models: dict[str, torch.nn.Module] = {"zoo ViT": ViT(config)}
    reference = timm_model(args)
    if reference is None:
        print("timm is not installed (pip install -e '.[bench]'): measuring zoo's ViT alone")
    else:
        copy_timm_into_zoo(reference, models["zoo ViT"])
        images = torch.randn(4, 3, args.image_size, args.image_size)
        with torch.no_grad():
            gap = (models["zoo ViT"].eval()(images) - reference.eval()(images)).abs().max().item()
        print(f"same weights, same function: max |logit difference| = {gap:.2e}")
        assert gap < 1e-4, f"zoo and timm disagree by {gap}: the comparison would not be like for like"
        models["timm ViT"] = reference

    paths: dict[str, Callable[[], float]] = {}
    for precision in args.precisions:
        for name, model in models.items():
            paths[f"{name}, train, {precision}"] = lambda m=model, p=precision: train_speed(m, args, p)
            paths[f"{name}, inference, {precision}"] = lambda m=model, p=precision: inference_speed(m, args, p)
    results: dict[str, list[float]] = {name: [] for name in paths}
    for round_index in range(args.rounds):
        for name, run in paths.items():
            results[name].append(run())
            print(f"round {round_index + 1}: {name:<34} {results[name][-1]:>8,.1f} images/s", flush=True)

    median = {name: statistics.median(values) for name, values in results.items()}
    parameters = sum(p.numel() for p in models["zoo ViT"].parameters())
    print(
        f"\nViT image {args.image_size} patch {args.patch_size} dim {args.dim} depth {args.depth} heads {args.heads}: "
        f"{parameters / 1e6:.2f}M parameters, batch {args.batch_size}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads\n"
    )
    for name, value in median.items():
        print(f"{name:<34} {value:>8,.1f} images/s  rounds: {', '.join(f'{v:,.1f}' for v in results[name])}")
    out = ratios(median, args.precisions) if reference is not None else {}
    for name, value in out.items():
        print(f"zoo / timm, {name}: {value:.3f}x")
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "args": vars(args), "parameters": parameters, "images_per_s": results, "median": median, "ratios": out,
    }  # fmt: skip
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1)
    return record


if __name__ == "__main__":
    main()
