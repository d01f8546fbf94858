"""mode=explain and zoo/explain.py: a ViT trained on images whose class is decided by one known patch must be
explained by that patch (every faithful method ranks it first; the seeded random map does not); the gradient
of an attention map taken from the kernel's output equals autograd's through the explicit weights; every
method runs on every attention variant; the mode writes a PNG and raw scores per image for ViT, CLIP and the
pixel-sequence classifier, and refuses what it cannot explain in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.io import write_png

from tests.helpers import VARIANTS, as_checkpoint, run_in_process, tiny_model, variant_runs
from zoo.explain import METHODS, attention_gradient, attribute, recorded_attention, subject_of
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
from zoo.models.vit import ViT, ViTConfig

KNOWN = 5  # the patch (row 1, column 1 of the 4 x 4 grid) that decides the class
QUIET = ["print_config=false", "logger=csv"]


def one_patch_images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """8 x 8 noise images; class 1 brightens patch KNOWN by +1, class 0 darkens it: nothing else tells them apart."""
    generator = torch.Generator().manual_seed(seed)
    images = 0.5 * torch.randn(count, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 2, (count,), generator=generator)
    row, col = divmod(KNOWN, 4)
    images[:, 0, 2 * row : 2 * row + 2, 2 * col : 2 * col + 2] += (2.0 * labels - 1.0)[:, None, None]
    return images.double(), labels


@pytest.fixture(scope="module")
def one_patch_vit() -> ViT:
    # float64: 150 steps in float32 ended in models that differ between hosts (AVX2 against AVX512 kernels round
    # differently), and raw attention's ranking with them (0.84 of the images on an AVX2 host, >= 0.9 elsewhere)
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=2, num_classes=2, dim=32, depth=2, num_heads=2)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):
        images, labels = one_patch_images(64, seed=step)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def top_patch_share(scores: torch.Tensor) -> float:
    return float((scores.argmax(dim=-1) == KNOWN).float().mean())


def test_every_faithful_method_ranks_the_deciding_patch_first_and_random_does_not(one_patch_vit) -> None:
    images, labels = one_patch_images(32, seed=10_000)
    assert (one_patch_vit(images).argmax(-1) == labels).float().mean() > 0.95  # the model learned the rule
    subject = subject_of(one_patch_vit)
    shares = {method: top_patch_share(attribute(subject, images, method, steps=16)) for method in METHODS}
    for method in ("attention", "rollout", "grad_attention", "integrated_gradients"):
        assert shares[method] >= 0.9, shares
    assert shares["random"] <= 0.25, shares
    # gradient x input is a first-order term at the embedding itself, measured against zero: the deciding patch
    # can carry a large negative product for one class, and a near-tie with others. It is a reference, not held
    # to ranking it first: by magnitude it must put the patch in its top 3 (a random map: 3 in 16)
    magnitude = attribute(subject, images, "input_x_grad").abs()
    top3 = (magnitude.topk(3, dim=-1).indices == KNOWN).any(dim=-1).float().mean()
    assert top3 >= 0.8, shares


def test_integrated_gradients_add_up_to_the_score_difference_to_the_all_zero_input() -> None:
    """Completeness (Sundararajan et al. 2017, prop. 1): the embedding attributions sum to f(x) - f(0), in fp64."""
    model = tiny_model("vit").double()
    images = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    target = model(images).argmax(-1)
    scores = attribute(subject_of(model), images, "integrated_gradients", target, steps=64)
    with torch.no_grad():
        difference = (model(images) - model(torch.zeros_like(images))).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(scores.sum(-1), difference.float(), atol=1e-5, rtol=1e-5)


def test_the_attention_gradient_from_the_output_equals_autograd_through_the_explicit_weights() -> None:
    """Full attention with need_weights computes out = A v from A in the graph: autograd's dy/dA is the reference."""
    model = tiny_model("vit", "gqa").double()
    images = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    with recorded_attention(model) as records:
        score = model(images)[:, 3].sum()
        weights = [record.weights for record in records]
        outs = [record.out for record in records]
        by_autograd = torch.autograd.grad(score, weights, retain_graph=True)
        out_grads = torch.autograd.grad(score, outs)
    for record, reference, out_grad in zip(records, by_autograd, out_grads):
        torch.testing.assert_close(attention_gradient(record, out_grad), reference)


@pytest.mark.parametrize("attention", [a for a in VARIANTS if variant_runs("vit", a)])
def test_every_method_explains_a_vit_of_every_attention_variant(attention: str) -> None:
    model = tiny_model("vit", attention)
    subject = subject_of(model)
    images = torch.randn(2, 1, 8, 8)
    for method in METHODS:
        scores = attribute(subject, images, method, steps=4)
        assert scores.shape == (2, 16) and bool(torch.isfinite(scores).all()), (method, scores)
        assert float(scores.std()) > 0, method  # not a constant map


def pixel_classifier() -> SequenceClassifier:
    torch.manual_seed(0)
    config = SequenceClassifierConfig(vocab_size=256, max_length=64, num_classes=10, padding_id=None, dim=16,
                                      depth=2, num_heads=2, mlp_dim=32)  # fmt: skip
    model = SequenceClassifier(config)
    torch.nn.init.normal_(model.head.weight, std=0.5)
    model.tokenizer, model.preprocessing, model.settings = None, None, {}
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("explain")
    images = root / "images"
    images.mkdir()
    generator = torch.Generator().manual_seed(0)
    for index in range(2):
        pixels = torch.randint(0, 256, (1, 8, 8), dtype=torch.uint8, generator=generator)
        write_png(pixels, str(images / f"{index}.png"))
    return {
        "root": root,
        "images": images,
        "vit": as_checkpoint(tiny_model("vit", "local"), root / "vit.ckpt"),
        "clip": as_checkpoint(tiny_model("clip", "linear"), root / "clip.ckpt"),
        "sequence_classifier": as_checkpoint(pixel_classifier(), root / "pixels.ckpt"),
        "gpt": as_checkpoint(tiny_model("gpt"), root / "gpt.ckpt"),
    }


@pytest.mark.parametrize(
    ("family", "method", "extra"),
    [
        ("vit", "grad_attention", []),
        ("vit", "integrated_gradients", ["steps=4"]),
        ("clip", "rollout", ['caption="a photo of the number 3."']),
        ("clip", "input_x_grad", []),
        ("sequence_classifier", "attention", []),
        ("sequence_classifier", "random", []),
    ],
)
def test_explain_writes_a_heat_map_and_raw_scores_per_image(checkpoints, family, method, extra, capsys) -> None:
    run_dir = checkpoints["root"] / f"run_{family}_{method}"
    args = [f"model={family}", "mode=explain", f"method={method}", f"ckpt_path={checkpoints[family]}",
            f"inputs={checkpoints['images']}", *extra, *QUIET, f"hydra.run.dir={run_dir}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-3000:]
    folder = run_dir / "explain"
    side = 8 if family == "sequence_classifier" else 4  # pixels, or the 4 x 4 patch grid
    for index in range(2):
        assert (folder / f"{index}_{method}.png").stat().st_size > 0
        scores = np.load(folder / f"{index}_{method}.npy")
        assert scores.shape == (side, side) and np.isfinite(scores).all()
    assert len((folder / "explain.csv").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["model=gpt", "ckpt_path={gpt}", "method=rollout"], "mode=explain is for model=vit | clip | sequence_"),
        (["model=vit", "ckpt_path={vit}", "method=saliency"], "method"),
        (["model=vit", "ckpt_path={vit}"], "mode=explain needs method=<attention | rollout | grad_attention"),
    ],
)
def test_what_cannot_be_explained_is_refused_in_one_line(checkpoints, args, fragment, capsys) -> None:
    names = {k: str(v) for k, v in checkpoints.items()}
    args = [a.format(**names) for a in args]
    run_dir = checkpoints["root"] / "bad"
    code, out, err = run_in_process(
        ["mode=explain", f"inputs={checkpoints['images']}", *args, *QUIET, f"hydra.run.dir={run_dir}"], capsys
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], (out + err)[-3000:]


def test_steps_zero_is_refused_not_read_as_the_default(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from zoo.app.explain import chosen_steps, explain_files
    from zoo.data.preprocessing import ImagePreprocessing

    cfg = OmegaConf.create({"method": "integrated_gradients", "steps": 0})
    with pytest.raises(ValueError, match=r"^steps must be a positive int, got 0$"):
        chosen_steps(cfg)
    preprocessing = ImagePreprocessing(image_size=8, in_channels=1, mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        explain_files(cfg, tiny_model("vit"), [], preprocessing, tmp_path / "explain")
    assert chosen_steps(OmegaConf.create({"steps": None})) > 0  # not given: the default


def test_a_file_that_is_not_an_image_is_refused_before_the_explain_folder_exists(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from zoo.app.explain import explain_files
    from zoo.data.preprocessing import ImagePreprocessing
    from zoo.errors import DataError

    good, bad = tmp_path / "0.png", tmp_path / "notes.png"
    write_png(torch.randint(0, 256, (1, 8, 8), dtype=torch.uint8), str(good))
    bad.write_text("not an image\n")
    cfg = OmegaConf.create({"method": "attention", "steps": None, "seed": 0})
    preprocessing = ImagePreprocessing(image_size=8, in_channels=1, mean=(0.5,), std=(0.5,))
    with pytest.raises(DataError, match=rf"cannot read '{bad}' as an image"):
        explain_files(cfg, tiny_model("vit"), [good, bad], preprocessing, tmp_path / "explain")
    assert not (tmp_path / "explain").exists()
