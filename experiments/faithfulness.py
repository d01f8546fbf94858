"""Is attention an explanation? Deletion / insertion perturbation curves (Petsiuk et al. 2018; Chefer et al. 2021's
positive / negative perturbation) of zoo's attribution methods (zoo/explain.py) on the digits and Fashion-MNIST
models: the area under each curve per method and model, bootstrap 95% intervals over images, and a plot of the curves.

    python experiments/faithfulness.py                      # trains what is missing (python run.py ...), measures
    python experiments/faithfulness.py --models vit_full vit_local --seeds 0 1
    python experiments/faithfulness.py --short 400 --models vit_full vit_local   # trained here, 400 batches
    python experiments/faithfulness.py --short 1000 --models fashion_vit_full --fashion-dir <fashion-mnist folder>
    python experiments/faithfulness.py --quick --out /tmp/f # seconds: tiny untrained models, 8 images (a smoke run)

Removing a token = replacing its pixels by the training data's mean pixel value (digits: 0.3 of full scale,
Fashion-MNIST: 0.286; 0 after normalisation; for the pixel-sequence classifier, the token of that value). The
target is the class the model predicts for the intact image (CLIP: its zero-shot class over the prompt-ensembled
class names); a curve is that class's softmax probability with 0, 10, ..., 100% of the tokens removed in the
method's order, most relevant first (deletion: lower AUC = more faithful), or inserted in that order into the
all-mean image (insertion: higher AUC = more faithful). Models named fashion_* read Fashion-MNIST (--fashion-dir:
its four idx files), the others scikit-learn's digits. Results: <out>/faithfulness.json and faithfulness.png; the
table is printed as Markdown.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data.captions import encode_captions, fill_templates  # noqa: E402
from zoo.data.images import DigitsDataModule, FashionMNISTDataModule, ImageClassificationDataModule  # noqa: E402
from zoo.data.preprocessing import ImagePreprocessing  # noqa: E402
from zoo.explain import METHODS, Subject, attribute, subject_of  # noqa: E402
from zoo.export import FAMILIES, family_of, load  # noqa: E402
from zoo.tasks.clip_evaluation import zero_shot_classifier  # noqa: E402

FRACTIONS = np.linspace(0.0, 1.0, 11)  # 10% steps
# name -> the training command's overrides (the committed recipes: the main job `python run.py model=vit`, its
# attention variants, CLIP's digits recipe, the pixel-sequence classifier's digits default, the Fashion-MNIST ViT)
MODELS = {
    "vit_full": ["model=vit", "attention=full"],
    "vit_local": ["model=vit", "attention=local"],
    "vit_linear": ["model=vit", "attention=linear"],
    "vit_axial": ["model=vit", "attention=axial"],
    "clip_full": ["model=clip"],
    "seq_full": ["model=sequence_classifier", "attention=full"],
    "fashion_vit_full": ["experiment=vit_fashion_mnist", "attention=full"],
    "fashion_vit_local": ["experiment=vit_fashion_mnist", "attention=local"],
    "fashion_vit_linear": ["experiment=vit_fashion_mnist", "attention=linear"],
    "fashion_vit_axial": ["experiment=vit_fashion_mnist", "attention=axial"],
}
# --short only: the recipes' local window (256) covers every token of these images, which makes local attention full
# attention; a window of one patch row either way (digits: 4 x 4 patches, Fashion-MNIST: 7 x 7) keeps it local
SHORT_OVERRIDES = {"vit_local": ["attention.window=8"], "fashion_vit_local": ["attention.window=14"]}
FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
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
def dataset_of(name: str) -> str:
    return "fashion" if name.startswith("fashion") else "digits"


def image_data(name: str, fashion_dir: str) -> ImageClassificationDataModule:
    """The images MODELS[name] reads: Fashion-MNIST's idx files in fashion_dir, or scikit-learn's digits split as
    the recipes split them (the 360 test images)."""
    if dataset_of(name) == "fashion":
        return FashionMNISTDataModule(data_dir=fashion_dir, download=False)
    return DigitsDataModule()


@functools.cache
def splits(dataset: str, fashion_dir: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images, train labels, test images, test labels) of a dataset, uint8 images: read once per run."""
    return image_data(dataset, fashion_dir).load()


def trained(name: str, seed: int, work: Path, fashion_dir: str) -> Path:
    """The checkpoint of MODELS[name] at `seed` under `work`, trained with run.py first if missing."""
    run_dir = work / f"{name}_s{seed}"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        data = [f"data.data_dir={fashion_dir}"] if dataset_of(name) == "fashion" else []
        command = [sys.executable, "run.py", *MODELS[name], *data, f"seed={seed}", *QUIET, f"hydra.run.dir={run_dir}"]
        print("training:", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
    return checkpoint


def recipe(name: str, overrides: list[str]) -> DictConfig:
    """The config `python run.py <MODELS[name]> <overrides>` composes (not resolved)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=[*MODELS[name], *overrides])
    finally:
        GlobalHydra.instance().clear()


def network(name: str, overrides: list[str], fashion_dir: str) -> tuple[torch.nn.Module, DictConfig]:
    """MODELS[name]'s network as its recipe (plus overrides) builds it, untrained, with the preprocessing of its
    data attached; and the recipe. The ViTs and the pixel-sequence classifier only (CLIP trains on captions)."""
    cfg = recipe(name, overrides)
    family = get_class(cfg.model._target_).family
    if family not in ("vit", "sequence_classifier"):
        built = [model for model in MODELS if not model.startswith("clip")]
        raise ValueError(f"--short and --quick build {' | '.join(built)} here, not {name!r} (run.py trains it)")
    net, config_class = FAMILIES[family]
    model = net(config_class.from_dict(OmegaConf.to_container(cfg.model.net, resolve=True)))
    model.preprocessing = None
    if family == "vit":
        data = image_data(name, fashion_dir)
        model.preprocessing = ImagePreprocessing(
            cfg.data.image_size, cfg.data.in_channels, data.mean, data.std, tuple(data.classes)
        )
    model.settings = {}
    return model, cfg


def short_trained(name: str, seed: int, steps: int, work: Path, fashion_dir: str) -> torch.nn.Module:
    """MODELS[name]'s network (its recipe's architecture and attention, SHORT_OVERRIDES applied) trained here for
    `steps` batches of the recipe's batch size without Lightning: AdamW at the recipe's learning rate and weight
    decay, the recipe's warmup share then cosine, label smoothing 0.1, no augmentation, no MixUp. For machines too
    busy for the recipe itself; the checkpoint-free weights are kept in <work>/<name>_s<seed>_short<steps>.pt."""
    torch.manual_seed(seed)
    model, cfg = network(name, SHORT_OVERRIDES.get(name, []), fashion_dir)
    path = work / f"{name}_s{seed}_short{steps}.pt"
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    images, labels, _, _ = splits(dataset_of(name), fashion_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.model.optimizer.lr,
                                  weight_decay=cfg.model.optimizer.weight_decay)  # fmt: skip
    warmup = max(1, int(steps * cfg.model.scheduler.warmup_ratio))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + np.cos(np.pi * (s - warmup) / steps))
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, len(images), (cfg.data.batch_size,), generator=generator)
        logits = model(model_inputs(family_of(model), model.preprocessing, images[batch]))
        loss = torch.nn.functional.cross_entropy(logits, labels[batch], label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    work.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 500) -> float:
    """Accuracy on a whole test split (CLIP: zero-shot)."""
    probe = Probe(model)
    with torch.no_grad():
        predicted = [
            probe.subject.score(probe.inputs(images[i : i + batch])).argmax(-1) for i in range(0, len(images), batch)
        ]
    return float((torch.cat(predicted) == labels).float().mean())


# the smoke run's untrained tiny networks (the recipes' layouts, narrower and shallower; local: window 4)
QUICK_OVERRIDES = ["model.net.dim=16", "model.net.depth=2", "model.net.num_heads=2", "model.net.mlp_dim=32"]
QUICK_MODELS = ["vit_full", "vit_local", "seq_full"]


def quick_models(names: list[str], fashion_dir: str) -> dict[str, torch.nn.Module]:
    """Untrained tiny versions of MODELS' networks (the smoke run), their heads scaled up so that the predicted
    class's probability moves."""
    torch.manual_seed(0)
    models = {}
    for name in names:
        window = ["attention.window=4"] if name.endswith("local") else []
        model, _ = network(name, QUICK_OVERRIDES + window, fashion_dir)
        torch.nn.init.normal_(model.head.weight, std=0.5)
        models[name] = model
    return models


def test_images(images: torch.Tensor, count: int) -> torch.Tensor:
    """`count` images of a test split (digits: the 360 every digits model above is tested on), a fixed random
    subset."""
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
    lines = [
        "| model | seeds | method | deletion AUC mean (range) | insertion AUC mean (range) |",
        "|---|---|---|---|---|",
    ]
    for model, seeds in by_model(results).items():
        for method in seeds[0]:
            cells = []
            for name in ("deletion", "insertion"):
                values = [seed[method][name]["auc"] for seed in seeds]
                cells.append(f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
            lines.append(f"| {model} | {len(seeds)} | {method} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def by_model(results: dict[str, dict]) -> dict[str, list[dict]]:
    """The runs of each model (runs named <model>_s<seed>), in their order."""
    models: dict[str, list[dict]] = {}
    for run, methods in results.items():
        models.setdefault(run.rsplit("_s", 1)[0], []).append(methods)
    return models


def plot(results: dict[str, dict], path: Path, columns: int = 5) -> None:
    """Per model, its deletion curves above its insertion curves (each the mean over its seeds), `columns` models a
    row; the legend gives each method's mean AUC."""
    models = by_model(results)
    columns = min(columns, len(models))
    blocks = -(-len(models) // columns)
    figure = Figure(figsize=(3.6 * columns, 6.4 * blocks), dpi=80, layout="constrained")
    axes = np.asarray(figure.subplots(2 * blocks, columns, squeeze=False))
    for panel in axes.ravel():
        panel.set_visible(False)
    for index, (model, seeds) in enumerate(models.items()):
        block, column = divmod(index, columns)
        for row, name in enumerate(("deletion", "insertion")):
            panel = axes[2 * block + row, column]
            panel.set_visible(True)
            for method in seeds[0]:
                curve = np.mean([seed[method][name]["curve"] for seed in seeds], axis=0)
                auc = np.mean([seed[method][name]["auc"] for seed in seeds])
                panel.plot(FRACTIONS, curve, ":" if method == "random" else "-", label=f"{method} ({auc:.2f})")
            title = f"{model} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}): {name}"
            panel.set(title=title, xlabel=f"share of tokens {name[:-3]}ed", ylabel="p(predicted class)")
            panel.title.set_fontsize(8)
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
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), help="default: all (--quick: vit_full vit_local seq_full)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--images", type=int, default=200, help="test images per model")
    parser.add_argument("--steps", type=int, default=32, help="integrated gradients' points on the path")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "faithfulness", help="training runs")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--quick", action="store_true", help="untrained tiny models, 8 images, 4 steps")
    parser.add_argument("--merge", nargs="+", type=Path, help="faithfulness.json files: combine, do not measure")
    parser.add_argument("--short", type=int, default=0, help="train here for this many batches, not with run.py")
    parser.add_argument("--fashion-dir", default=FASHION_DIR, help="Fashion-MNIST's four idx files (fashion_* models)")
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
    if args.quick:
        args.images, args.steps = 8, 4
        runs = {name: (name, None) for name in args.models or QUICK_MODELS}
        quick = quick_models(list(runs), args.fashion_dir)
    else:
        # runs trained here say so in their name (vit_full_short800_s0), beside the recipe's (vit_full_s0)
        trained_here = f"_short{args.short}" if args.short else ""
        runs = {f"{name}{trained_here}_s{seed}": (name, seed) for seed in args.seeds for name in args.models or MODELS}
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"images": args.images, "steps": args.steps, "fractions": FRACTIONS.tolist(), "removed": "mean pixel",
                "short": args.short, "short_overrides": SHORT_OVERRIDES if args.short else {},
                "accuracy": {}}  # fmt: skip
    results, first = {}, None
    for run, (name, seed) in runs.items():  # one at a time, the JSON rewritten after each: a long run keeps its part
        if args.quick:
            model = quick[name]
        elif args.short:
            model = short_trained(name, seed, args.short, args.work, args.fashion_dir)
        else:
            model = load(trained(name, seed, args.work, args.fashion_dir))
        _, _, images, labels = splits(dataset_of(name), args.fashion_dir)
        settings["accuracy"][run] = accuracy(model, images, labels)
        print(f"{run}: test accuracy {settings['accuracy'][run]:.4f} ({len(images)} test images); "
              f"{args.images} measured", flush=True)  # fmt: skip
        pixels = test_images(images, args.images)
        results[run] = measure(Probe(model), pixels, args.steps)
        (args.out / "faithfulness.json").write_text(json.dumps({"settings": settings, "results": results}, indent=1))
        first = first or (model, pixels[0], run)
    plot(results, args.out / "faithfulness.png")
    model, image, run = first
    example_figure(Probe(model), image, results[run], args.out / "faithfulness_example.png", args.steps)
    print(table(results))
    print(f"wrote {args.out / 'faithfulness.json'} and {args.out / 'faithfulness.png'}")


if __name__ == "__main__":
    main()
