"""Is attention an explanation? Deletion / insertion perturbation curves (Petsiuk et al. 2018; Chefer et al. 2021's
positive / negative perturbation) of zoo's attribution methods (zoo/explain.py) on the digits models: the area
under each curve per method and model, bootstrap 95% intervals over images, and a plot of the curves.

    python experiments/faithfulness.py                      # trains what is missing (python run.py ...), measures
    python experiments/faithfulness.py --models vit_full vit_local --seeds 0 1
    python experiments/faithfulness.py --short 400 --models vit_full vit_local   # trained here, 400 batches
    python experiments/faithfulness.py --quick --out /tmp/f # seconds: tiny untrained models, 8 images (a smoke run)

Removing a token = replacing its pixels by the training data's mean pixel value (digits: 0.3 of full scale, which
is 0 after normalisation; for the pixel-sequence classifier, the token of that value). The target is the class the
model predicts for the intact image (CLIP: its zero-shot class over the prompt-ensembled class names); a curve is
that class's softmax probability with 0, 10, ..., 100% of the tokens removed in the method's order, most relevant
first (deletion: lower AUC = more faithful), or inserted in that order into the all-mean image (insertion: higher
AUC = more faithful). Results: <out>/faithfulness.json and faithfulness.png; the table is printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data.captions import encode_captions, fill_templates  # noqa: E402
from zoo.data.images import DigitsDataModule  # noqa: E402
from zoo.explain import METHODS, Subject, attribute, subject_of  # noqa: E402
from zoo.export import family_of, load  # noqa: E402
from zoo.tasks.clip_evaluation import zero_shot_classifier  # noqa: E402

FRACTIONS = np.linspace(0.0, 1.0, 11)  # 10% steps
# name -> the training command's overrides (the committed recipes: the main job `python run.py model=vit`, its
# attention variants, CLIP's digits recipe, the pixel-sequence classifier's digits default)
MODELS = {
    "vit_full": ["model=vit", "attention=full"],
    "vit_local": ["model=vit", "attention=local"],
    "vit_linear": ["model=vit", "attention=linear"],
    "vit_axial": ["model=vit", "attention=axial"],
    "clip_full": ["model=clip"],
    "seq_full": ["model=sequence_classifier", "attention=full"],
}
QUIET = ["print_config=false", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]


# -- the measurement ------------------------------------------------------------------------------------------
def perturbation_curves(
    probability: Callable[[torch.Tensor], torch.Tensor],
    pixels: torch.Tensor,
    to_pixel_mask: Callable[[torch.Tensor], torch.Tensor],
    scores: torch.Tensor,
    fill: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Deletion and insertion curves (B, len(FRACTIONS)). pixels uint8 (B, C, H, W); scores (B, tokens), higher =
    removed / inserted first; to_pixel_mask: token mask (B, tokens) -> pixel mask (B, 1, H, W); fill: the removed
    value; probability(pixels) -> the target class's probability (B,)."""
    tokens = scores.shape[-1]
    order = scores.argsort(dim=-1, descending=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(tokens).expand_as(order))
    baseline = torch.full_like(pixels, fill)
    deletion, insertion = [], []
    for fraction in FRACTIONS:
        chosen = to_pixel_mask(ranks < round(fraction * tokens))
        deletion.append(probability(torch.where(chosen, baseline, pixels)))
        insertion.append(probability(torch.where(chosen, pixels, baseline)))
    return torch.stack(deletion, 1).numpy(), torch.stack(insertion, 1).numpy()


def area(curves: np.ndarray) -> np.ndarray:
    """Per image, the area under its curve over the removed fraction (trapezoids): (B,)."""
    return ((curves[:, 1:] + curves[:, :-1]) / 2 * np.diff(FRACTIONS)).sum(axis=1)


def bootstrap_interval(values: np.ndarray, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the mean over images, from `resamples` resamplings of the images."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


class Probe:
    """A trained model read as the methods and the curves need it: its Subject, how pixels become its input, how
    a token mask covers pixels, and the removed value."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.family = family_of(model)
        self.model = model.eval()
        preprocessing = model.preprocessing
        self.preprocessing = preprocessing
        text = None
        if self.family == "clip":
            classes = list(preprocessing.classes)
            templates = list(model.settings.get("templates") or ["a photo of the number {label}."])
            prompts = [encode_captions(model.tokenizer, row) for row in fill_templates(templates, classes)]
            with torch.no_grad():
                text = zero_shot_classifier(model, prompts)
        self.subject: Subject = subject_of(model, text)
        mean = preprocessing.mean[0] if preprocessing is not None else DigitsDataModule.mean[0]
        self.fill = round(255 * mean)
        self.patch = 1 if self.family == "sequence_classifier" else model_patch(model)

    def inputs(self, pixels: torch.Tensor) -> torch.Tensor:
        return model_inputs(self.family, self.preprocessing, pixels)

    def pixel_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        side = int(round(tokens.shape[-1] ** 0.5))
        grid = tokens.reshape(-1, 1, side, side)
        return grid.repeat_interleave(self.patch, dim=2).repeat_interleave(self.patch, dim=3)

    @torch.no_grad()
    def probability(self, pixels: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.subject.score(self.inputs(pixels)).softmax(dim=-1).gather(1, target[:, None])[:, 0]


def model_inputs(family: str, preprocessing, pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels (B, C, H, W) -> what the model reads: normalised images, or (B, H * W) pixel tokens."""
    if family == "sequence_classifier":
        return pixels.flatten(1).long()
    return preprocessing.normalize(pixels)


def model_patch(model: torch.nn.Module) -> int:
    tower = model.image_encoder if family_of(model) == "clip" else model
    return tower.config.patch_size


def measure(probe: Probe, pixels: torch.Tensor, steps: int, batch: int = 50) -> dict[str, dict]:
    """Per method: the mean deletion and insertion curves, per-image AUCs, their means and 95% intervals."""
    with torch.no_grad():
        target = probe.subject.score(probe.inputs(pixels)).argmax(dim=-1)
    results = {}
    for method in METHODS:
        started = time.perf_counter()
        deletion, insertion = [], []
        for start in range(0, len(pixels), batch):
            chunk, chunk_target = pixels[start : start + batch], target[start : start + batch]
            scores = attribute(probe.subject, probe.inputs(chunk), method, chunk_target, steps=steps, seed=start)
            curves = perturbation_curves(
                lambda p, t=chunk_target: probe.probability(p, t), chunk, probe.pixel_mask, scores, probe.fill
            )
            deletion.append(curves[0])
            insertion.append(curves[1])
        deletion, insertion = np.concatenate(deletion), np.concatenate(insertion)
        row = {"seconds": round(time.perf_counter() - started, 1)}
        for name, curves in (("deletion", deletion), ("insertion", insertion)):
            aucs = area(curves)
            row[name] = {"auc": float(aucs.mean()), "ci95": bootstrap_interval(aucs), "curve": curves.mean(0).tolist()}
        results[method] = row
        print(f"  {method:22s} deletion {row['deletion']['auc']:.3f}  insertion {row['insertion']['auc']:.3f}  "
              f"({row['seconds']} s)", flush=True)  # fmt: skip
    return results


# -- models ---------------------------------------------------------------------------------------------------
def trained(name: str, seed: int, work: Path) -> Path:
    """The checkpoint of MODELS[name] at `seed` under `work`, trained with run.py first if missing."""
    run_dir = work / f"{name}_s{seed}"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        command = [sys.executable, "run.py", *MODELS[name], f"seed={seed}", *QUIET, f"hydra.run.dir={run_dir}"]
        print("training:", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
    return checkpoint


def short_trained(name: str, seed: int, steps: int, work: Path) -> torch.nn.Module:
    """MODELS[name]'s network (conf/model's architecture and attention) trained here for `steps` batches of 64
    digits without Lightning: AdamW at the recipe's learning rate and weight decay, 10% warmup then cosine,
    label smoothing 0.1, no MixUp. For machines too busy for the recipe itself; the checkpoint-free weights are
    kept in <work>/<name>_s<seed>_short<steps>.pt."""
    from zoo.data.preprocessing import ImagePreprocessing
    from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
    from zoo.models.vit import ViT, ViTConfig

    # local: window 8 (4 tokens each side: a patch row either way); the recipe's 256 covers 17 tokens whole
    variants = {"full": {}, "local": {"window": 8}, "linear": {},
                "axial": {}}  # fmt: skip
    variant = name.split("_", 1)[1]
    attention = {"variant": variant, **variants[variant]}
    torch.manual_seed(seed)
    digits = ImagePreprocessing(8, 1, DigitsDataModule.mean, DigitsDataModule.std, DigitsDataModule.classes)
    if name.startswith("vit"):
        model = ViT(
            ViTConfig(dim=64, depth=4, num_heads=4, mlp_dim=128, dropout=0.1, drop_path=0.1, attention=attention)
        )
        model.preprocessing, lr, weight_decay = digits, 2e-3, 0.1
    elif name.startswith("seq"):
        config = SequenceClassifierConfig(vocab_size=256, max_length=64, num_classes=10, dim=64, depth=2, num_heads=4,
                                          mlp_dim=128, dropout=0.1, attention=attention)  # fmt: skip
        model, lr, weight_decay = SequenceClassifier(config), 1e-3, 0.05
        model.preprocessing = None
    else:
        raise ValueError(f"--short trains the ViTs and the pixel-sequence classifier here, not {name!r}")
    model.settings = {}
    path = work / f"{name}_s{seed}_short{steps}.pt"
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    images, labels, _, _ = DigitsDataModule().load()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + np.cos(np.pi * (s - warmup) / steps))
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, len(images), (64,), generator=generator)
        logits = model(model_inputs(family_of(model), digits, images[batch]))
        loss = torch.nn.functional.cross_entropy(logits, labels[batch], label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    work.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


def accuracy(model: torch.nn.Module) -> float:
    """Test accuracy on the whole digits test split (CLIP: zero-shot)."""
    probe = Probe(model)
    _, _, images, labels = DigitsDataModule().load()
    with torch.no_grad():
        predicted = probe.subject.score(probe.inputs(images)).argmax(dim=-1)
    return float((predicted == labels).float().mean())


def quick_models() -> dict[str, torch.nn.Module]:
    """Untrained tiny digits models (the smoke run): a ViT with full and with local attention, a pixel classifier."""
    from zoo.data.preprocessing import ImagePreprocessing
    from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
    from zoo.models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    digits = ImagePreprocessing(8, 1, DigitsDataModule.mean, DigitsDataModule.std, DigitsDataModule.classes)
    models = {}
    for variant, options in (("full", {}), ("local", {"window": 4})):
        vit = ViT(ViTConfig(dim=16, depth=2, num_heads=2, mlp_dim=32, attention={"variant": variant, **options}))
        torch.nn.init.normal_(vit.head.weight, std=0.5)
        vit.preprocessing, vit.settings = digits, {}
        models[f"vit_{variant}"] = vit
    config = SequenceClassifierConfig(vocab_size=256, max_length=64, num_classes=10, dim=16, depth=1, num_heads=2)
    pixels = SequenceClassifier(config)
    torch.nn.init.normal_(pixels.head.weight, std=0.5)
    pixels.preprocessing, pixels.settings = None, {}
    models["seq_full"] = pixels
    return models


def test_images(count: int) -> torch.Tensor:
    """`count` images of the digits test split (the 360 every model above is tested on), a fixed random subset."""
    _, _, images, _ = DigitsDataModule().load()
    chosen = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:count]
    return images[chosen.sort().values]


# -- report ---------------------------------------------------------------------------------------------------
def table(results: dict[str, dict]) -> str:
    lines = [
        "| model | method | deletion AUC (lower = more faithful) [95% CI] | insertion AUC (higher) [95% CI] |",
        "|---|---|---|---|",
    ]
    for run, methods in results.items():
        for method, row in methods.items():
            cells = []
            for name in ("deletion", "insertion"):
                low, high = row[name]["ci95"]
                cells.append(f"{row[name]['auc']:.3f} [{low:.3f}, {high:.3f}]")
            lines.append(f"| {run} | {method} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def seed_summary(results: dict[str, dict]) -> str:
    """Per model (runs named <model>_s<seed>) and method: the mean AUC over seeds and its range."""
    by_model: dict[str, list[dict]] = {}
    for run, methods in results.items():
        by_model.setdefault(run.rsplit("_s", 1)[0], []).append(methods)
    lines = [
        "| model | seeds | method | deletion AUC mean (range) | insertion AUC mean (range) |",
        "|---|---|---|---|---|",
    ]
    for model, seeds in by_model.items():
        for method in seeds[0]:
            cells = []
            for name in ("deletion", "insertion"):
                values = [seed[method][name]["auc"] for seed in seeds]
                cells.append(f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
            lines.append(f"| {model} | {len(seeds)} | {method} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path, columns: int = 5) -> None:
    """Per run, its deletion curves above its insertion curves, `columns` runs a row."""
    runs = list(results)
    columns = min(columns, len(runs))
    blocks = -(-len(runs) // columns)
    figure = Figure(figsize=(3.6 * columns, 6.4 * blocks), dpi=80, layout="constrained")
    axes = np.asarray(figure.subplots(2 * blocks, columns, squeeze=False))
    for panel in axes.ravel():
        panel.set_visible(False)
    for index, run in enumerate(runs):
        block, column = divmod(index, columns)
        for row, name in enumerate(("deletion", "insertion")):
            panel = axes[2 * block + row, column]
            panel.set_visible(True)
            for method, values in results[run].items():
                style = ":" if method == "random" else "-"
                panel.plot(FRACTIONS, values[name]["curve"], style, label=f"{method} ({values[name]['auc']:.2f})")
            panel.set(title=f"{run}: {name}", xlabel=f"share of tokens {name[:-3]}ed", ylabel="p(predicted class)")
            panel.set_ylim(0, 1.02)
            panel.legend(fontsize=7)
    figure.savefig(path)


def example_figure(probe: Probe, image: torch.Tensor, results: dict, path: Path, steps: int) -> None:
    """One test image and every method's map of it, each titled with the method's AUCs over the test images:
    a map and its faithfulness side by side (docs/explain.md)."""
    inputs = probe.inputs(image[None])
    figure = Figure(figsize=(2.3 * (len(METHODS) + 1), 2.9), dpi=100, layout="constrained")
    panels = figure.subplots(1, len(METHODS) + 1)
    panels[0].imshow(image[0].numpy(), cmap="gray")
    panels[0].set(title="input", xticks=[], yticks=[])
    for panel, method in zip(panels[1:], METHODS):
        scores = attribute(probe.subject, inputs, method, steps=steps)[0]
        side = int(round(scores.numel() ** 0.5))
        panel.imshow(scores.reshape(side, side).numpy(), cmap="inferno")
        row = results[method]
        panel.set(
            xticks=[], yticks=[], title=f"{method}\ndel {row['deletion']['auc']:.2f} ins {row['insertion']['auc']:.2f}"
        )
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--images", type=int, default=200, help="test images per model")
    parser.add_argument("--steps", type=int, default=32, help="integrated gradients' points on the path")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "faithfulness", help="training runs")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--quick", action="store_true", help="untrained tiny models, 8 images, 4 steps")
    parser.add_argument("--merge", nargs="+", type=Path, help="faithfulness.json files: combine, do not measure")
    parser.add_argument("--short", type=int, default=0, help="train here for this many batches, not with run.py")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared machine; the batches here are small
    if args.merge:
        loaded = [json.loads(path.read_text()) for path in args.merge]
        results = {run: row for part in loaded for run, row in part["results"].items()}
        settings = {"merged": [str(path) for path in args.merge], "parts": [part["settings"] for part in loaded]}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "faithfulness.json").write_text(json.dumps({"settings": settings, "results": results}, indent=1))
        plot(results, args.out / "faithfulness.png")
        print(table(results), seed_summary(results), sep="\n\n")
        return
    runs = [(name, seed) for seed in args.seeds for name in args.models]
    if args.quick:
        models = quick_models()
        args.images, args.steps = 8, 4
    elif args.short:
        models = {f"{name}_s{seed}": short_trained(name, seed, args.short, args.work) for name, seed in runs}
    else:
        models = {f"{name}_s{seed}": load(trained(name, seed, args.work)) for name, seed in runs}
    pixels = test_images(args.images)
    results = {}
    accuracies = {}
    for run, model in models.items():
        accuracies[run] = accuracy(model)
        print(f"{run}: test accuracy {accuracies[run]:.4f}; {args.images} test images", flush=True)
        results[run] = measure(Probe(model), pixels, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"images": args.images, "steps": args.steps, "fractions": FRACTIONS.tolist(), "removed": "mean pixel",
                "short": args.short, "accuracy": accuracies}  # fmt: skip
    (args.out / "faithfulness.json").write_text(json.dumps({"settings": settings, "results": results}, indent=1))
    plot(results, args.out / "faithfulness.png")
    first = next(iter(models))
    example_figure(Probe(models[first]), pixels[0], results[first], args.out / "faithfulness_example.png", args.steps)
    print(table(results))
    print(f"wrote {args.out / 'faithfulness.json'} and {args.out / 'faithfulness.png'}")


if __name__ == "__main__":
    main()
