"""Using a trained model through run.py: predict, zero_shot, retrieve, attention_maps and export, each from
ckpt_path= (a checkpoint or an exported folder), end to end on tiny checkpoints made here. Predictions
equal the model's own forward on the same tensors; exported folders and ONNX graphs give the same outputs;
attention maps exist for every family and attention variant; bad input is one line with exit status 2."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

import pytest
import torch

import zoo
from tests.helpers import REFUSED, VARIANTS, as_checkpoint, run_in_process, tiny_model, variant_runs
from zoo.data.captions import encode_captions
from zoo.data.images import DigitsDataModule
from zoo.export import save_folder

QUIET = ["print_config=false", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]


def run(args: list[str], run_dir: Path, capsys) -> str:
    code, out, err = run_in_process([*args, "print_config=false", f"hydra.run.dir={run_dir}"], capsys)
    assert code == 0, (out + err)[-3000:]
    return out


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, trained_runs) -> dict:
    """A ViT and a CLIP trained for two batches through run.py (the session's, tests/conftest.py); a GPT and a
    translation model as checkpoints."""
    root = tmp_path_factory.mktemp("modes")
    out = {}
    for name in ("vit", "clip"):
        trained = trained_runs[f"{name}_small"]
        out[name], out[f"{name}_stdout"] = trained.checkpoint, trained.stdout
    out["gpt"] = as_checkpoint(tiny_model("gpt"), root / "gpt.ckpt")
    out["translation"] = as_checkpoint(tiny_model("translation"), root / "translation.ckpt")
    out["sequence_classifier"] = as_checkpoint(tiny_model("sequence_classifier"), root / "sequence_classifier.ckpt")
    out["root"] = root
    return out


def test_a_vit_run_ends_with_the_command_that_predicts_and_it_equals_the_models_own_forward(world, capsys) -> None:
    last = world["vit_stdout"].strip().splitlines()[-1].strip()
    assert last.startswith("python run.py model=vit ckpt_path=") and last.split()[4:5] == ["mode=predict"], last
    assert " inputs=" in last
    args = shlex.split(last)[2:]
    run([*args, "top_k=3"], world["root"] / "predict", capsys)
    predicted = rows(world["root"] / "predict" / "predictions.csv")
    model, data = zoo.load(world["vit"]), DigitsDataModule(image_size=8, in_channels=1, num_classes=10)
    data.setup()
    examples = sorted({row["image"] for row in predicted})
    assert len(examples) == 10 and len(predicted) == 30
    for image in examples:
        index = int(Path(image).name.split("_")[0])
        with torch.no_grad():
            probabilities = model(data.test_set[index][0][None]).softmax(dim=-1)[0]  # the test split's own tensor
        values, classes = probabilities.topk(3)
        mine = [row for row in predicted if row["image"] == image]
        assert [row["class"] for row in mine] == [str(c) for c in classes.tolist()]
        assert [float(row["probability"]) for row in mine] == pytest.approx(values.tolist(), abs=1e-4)


def test_an_exported_folder_predicts_the_same_and_onnx_matches_pytorch(world, capsys) -> None:
    root, examples = world["root"], world["vit"].parents[1] / "examples"
    run(["mode=export", f"ckpt_path={world['vit']}"], root / "export", capsys)
    folder = root / "export" / "export"
    older = torch.load(world["vit"], weights_only=True)
    del older["preprocessing"]  # as zoo wrote checkpoints before they carried it: the configured data's is used
    torch.save(older, root / "older.ckpt")
    sources = {"from_checkpoint": world["vit"], "from_folder": folder, "from_older": root / "older.ckpt"}
    for name, source in sources.items():
        run(["mode=predict", f"ckpt_path={source}", f"inputs={examples}"], root / name, capsys)
    expected = rows(root / "from_checkpoint" / "predictions.csv")
    assert rows(root / "from_folder" / "predictions.csv") == rows(root / "from_older" / "predictions.csv") == expected
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = run(["mode=export", "format=onnx", f"ckpt_path={world['vit']}"], root / "onnx", capsys)
    assert "largest difference to PyTorch" in out
    model, images = zoo.load(world["vit"]), zoo.load(folder).preprocessing.load([next(examples.iterdir())])
    session = onnxruntime.InferenceSession(str(root / "onnx" / "export" / "model.onnx"))
    (logits,) = session.run(["logits"], {"images": images.numpy()})
    with torch.no_grad():
        assert (torch.from_numpy(logits) - model(images)).abs().max() <= 1e-4


def test_the_clip_checkpoint_carries_classes_templates_and_preprocessing_for_zero_shot(world, capsys) -> None:
    model = zoo.load(world["clip"])
    assert model.preprocessing.classes == tuple(str(d) for d in range(10))
    assert model.settings["templates"][0] == "a photo of the number {label}."
    examples = world["vit"].parents[1] / "examples"
    run(["model=clip", "mode=zero_shot", f"ckpt_path={world['clip']}", f"inputs={examples}", "top_k=10"],
        world["root"] / "zero_shot", capsys)  # fmt: skip
    found = rows(world["root"] / "zero_shot" / "zero_shot.csv")
    files = sorted(examples.iterdir())
    templates = model.settings["templates"]
    prompts = [encode_captions(model.tokenizer, [t.format(label=d) for d in range(10)]) for t in templates]
    with torch.no_grad():
        classes = torch.nn.functional.normalize(sum(model.encode_text(p) for p in prompts), dim=-1)
        probabilities = (model.scale() * model.encode_image(model.preprocessing.load(files)) @ classes.T).softmax(-1)
    for file, p in zip(files, probabilities):
        mine = {row["class"]: float(row["probability"]) for row in found if row["image"] == str(file)}
        assert mine == pytest.approx({str(c): float(p[c]) for c in range(10)}, abs=1e-4)
    run(["model=clip", "mode=zero_shot", f"ckpt_path={world['clip']}", f"inputs={files[0]}", "classes=[cat,dog]",
         'templates=["a drawing of a {label}."]'], world["root"] / "given", capsys)  # fmt: skip
    given = {row["class"]: float(row["probability"]) for row in rows(world["root"] / "given" / "zero_shot.csv")}
    with torch.no_grad():
        classes = model.encode_text(encode_captions(model.tokenizer, ["a drawing of a cat.", "a drawing of a dog."]))
        p = (model.scale() * model.encode_image(model.preprocessing.load(files[:1])) @ classes.T).softmax(-1)[0]
    assert given == pytest.approx({"cat": float(p[0]), "dog": float(p[1])}, abs=1e-4)


def test_retrieval_in_both_directions_ranks_by_cosine_similarity(world, capsys) -> None:
    model, examples = zoo.load(world["clip"]), world["vit"].parents[1] / "examples"
    files = sorted(examples.iterdir())
    run(["model=clip", "mode=retrieve", f"ckpt_path={world['clip']}", f"inputs={examples}",
         "query=a photo of the number 3.", "top_k=10"], world["root"] / "text_query", capsys)  # fmt: skip
    found = rows(world["root"] / "text_query" / "retrieval.csv")
    with torch.no_grad():
        images = model.encode_image(model.preprocessing.load(files))
        text = model.encode_text(encode_captions(model.tokenizer, ["a photo of the number 3."]))
    scores = (text @ images.T)[0]
    assert [row["image"] for row in found] == [str(files[i]) for i in scores.argsort(descending=True).tolist()]
    captions = ["the digit 7.", "a photo of the number 3."]
    run(["model=clip", "mode=retrieve", f"ckpt_path={world['clip']}", f"query={files[0]}",
         f"captions=[{captions[0]},{captions[1]}]"], world["root"] / "image_query", capsys)  # fmt: skip
    found = rows(world["root"] / "image_query" / "retrieval.csv")
    with torch.no_grad():
        scores = images[0] @ model.encode_text(encode_captions(model.tokenizer, captions)).T
    assert [row["caption"] for row in found] == [captions[i] for i in scores.argsort(descending=True).tolist()]
    assert float(found[0]["score"]) == pytest.approx(float(scores.max()), abs=1e-4)


def test_attention_maps_of_every_family_are_pngs_and_reach_the_loggers(world, capsys) -> None:
    example = next((world["vit"].parents[1] / "examples").iterdir())
    cases = {
        "vit": ["model=vit", f"inputs={example}", "logger=tensorboard"],
        "clip": ["model=clip", f"inputs={example}"],
        "gpt": ["model=gpt", 'prompt="def f(x):"'],
        "translation": ["model=translation", 'text=["eins zwei",drei]'],
    }
    expected = {
        "vit": {f"{example.stem}_rollout.png", f"{example.stem}_layers.png"},
        "clip": {f"{example.stem}_rollout.png", f"{example.stem}_layers.png"},
        "gpt": {"layer0.png", "layer1.png"},
        "translation": {"alignment0.png", "alignment1.png"},
    }
    for family, args in cases.items():
        run_dir = world["root"] / f"attention_{family}"
        out = run(["mode=attention_maps", f"ckpt_path={world[family]}", *args], run_dir, capsys)
        assert f"attention maps of the {family} model" in out
        written = {p.name for p in (run_dir / "attention").iterdir()}
        assert written == expected[family] and all(p.stat().st_size > 0 for p in (run_dir / "attention").iterdir())
    events = list((world["root"] / "attention_vit" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 1000  # the two pictures, logged to TensorBoard


def test_attention_maps_name_the_attention_they_show(world, capsys) -> None:
    """CLIP with attention set per tower (model.net.attention=null, the README's compressed image tower) and a
    GPT with a pattern, a bias and grouped heads, through run.py."""
    example = next((world["vit"].parents[1] / "examples").iterdir())
    root = world["root"]
    clip = as_checkpoint(tiny_model("clip", "compressed"), root / "clip_compressed.ckpt")
    out = run(["model=clip", "mode=attention_maps", f"ckpt_path={clip}", f"inputs={example}"], root / "maps_c", capsys)
    assert "attention maps of the clip model (compressed attention)" in out
    sparse = {"variant": "sparse", "stride": 2, "position_bias": "alibi", "kv_heads": 1}
    gpt = as_checkpoint(tiny_model("gpt", sparse), root / "gpt_sparse.ckpt")
    out = run(["model=gpt", "mode=attention_maps", f"ckpt_path={gpt}", "prompt=def"], root / "maps_g", capsys)
    assert "attention maps of the gpt model (sparse attention, alibi bias, 1 kv head(s))" in out


MAP_FAMILIES = ("vit", "clip", "gpt", "translation")
RUNNING = [(family, attention) for family in MAP_FAMILIES for attention in VARIANTS if variant_runs(family, attention)]


def test_the_variants_left_out_of_a_family_are_refused_by_it() -> None:
    for family, attention in sorted(REFUSED):
        with pytest.raises(ValueError, match="bidirectional only|biases distances along a token sequence"):
            tiny_model(family, attention)


def self_attention_faithful(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    """The largest difference between the first block's self-attention output and out_proj(weights @ v) of the
    weights that attention_weights reports for it: the maps are what the kernel applies (bias, groups included)."""
    attention = model.blocks[0].self_attn
    seen = {}
    handle = attention.register_forward_hook(lambda module, args, output: seen.update(x=args[0], output=output))
    try:
        weights = model.attention_weights(inputs)[0]
    finally:
        handle.remove()
    out, reported = seen["output"]
    assert torch.equal(reported, weights)
    with torch.no_grad():
        v = attention._heads_qkv(seen["x"])[2]  # (B, G, T, D)
        v = v.repeat_interleave(weights.shape[1] // v.shape[1], dim=1)  # grouped heads: query head h uses h // (H/G)
        mixed = (weights @ v).transpose(1, 2).reshape(out.shape)
        return float((attention.out_proj(mixed) - out).abs().max())


@pytest.mark.parametrize(("family", "attention"), RUNNING, ids=[f"{f}-{a}" for f, a in RUNNING])
def test_attention_maps_exist_for_every_variant(family: str, attention: str, tmp_path: Path) -> None:
    from torchvision.io import write_png

    from zoo.app.modes import gpt_attention_figures, image_attention_figures
    from zoo.models.vit import attention_rollout
    from zoo.tasks.translation import alignment_figure

    model = tiny_model(family, attention)
    if family in ("vit", "clip"):
        write_png(torch.randint(0, 256, (1, 8, 8), dtype=torch.uint8), str(tmp_path / "digit.png"))
        vit = model if family == "vit" else model.image_encoder
        figures = image_attention_figures(vit, model.preprocessing, [tmp_path / "digit.png"])
        assert set(figures) == {"digit_rollout", "digit_layers"}
        images = model.preprocessing.load([tmp_path / "digit.png"])
        rollout = attention_rollout(vit.attention_weights(images))
        assert rollout.min() >= 0 and torch.allclose(rollout.sum(dim=-1), torch.ones(1, 17), atol=1e-5)
        shown = figures["digit_rollout"].axes[1].images[0].get_array()
        assert torch.allclose(torch.as_tensor(shown), rollout[0, 0, 1:].reshape(4, 4))  # the class token's row
        assert self_attention_faithful(vit, images) < 1e-5
    elif family == "gpt":
        figures = gpt_attention_figures(model, "def f(x):")
        assert set(figures) == {"layer0", "layer1"}
        labels = [t.get_text() for t in figures["layer0"].axes[0].get_xticklabels()]
        assert labels == list("def") + ["▁"] + list("f(x):")  # the space as the tokenizer writes it
        assert self_attention_faithful(model, torch.tensor([model.tokenizer.encode("def f(x):").ids])) < 1e-5
    else:
        source = [model.tokenizer.token_to_id(c) for c in "eins"] + [2]
        figures = {"alignment": alignment_figure(model, model.tokenizer, source, [5, 6])}
    for figure in figures.values():
        assert any(axes.get_label() == "<colorbar>" for axes in figure.axes)
        panels = [axes for axes in figure.axes if axes.get_visible() and axes.get_label() != "<colorbar>"]
        assert all(panel.get_xlabel() or panel.get_title() for panel in panels)


def test_the_gpt_exports_as_a_huggingface_gpt2_folder(world, capsys) -> None:
    transformers = pytest.importorskip("transformers")
    run(["model=gpt", "mode=export", "format=huggingface", f"ckpt_path={world['gpt']}"], world["root"] / "hf", capsys)
    hf = transformers.GPT2LMHeadModel.from_pretrained(world["root"] / "hf" / "export").eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, zoo.load(world["gpt"])(ids), atol=1e-5, rtol=1e-5)


def test_the_sequence_classifier_exports_to_a_folder_and_onnx(world, capsys) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run_dir = world["root"] / "export_sequence_classifier"
    args = ["model=sequence_classifier", "mode=export", "format=onnx", f"ckpt_path={world['sequence_classifier']}"]
    out = run(args, run_dir, capsys)
    assert "exported the sequence_classifier model" in out and "largest difference to PyTorch" in out
    model, folder = zoo.load(world["sequence_classifier"]), run_dir / "export"
    ids = torch.randint(
        1, model.config.vocab_size, (1, model.config.max_length), generator=torch.Generator().manual_seed(3)
    )
    ids[0, -4:] = model.config.padding_id
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    (logits,) = session.run(["logits"], {"input_ids": ids.numpy()})
    with torch.no_grad():
        assert torch.equal(zoo.load(folder)(ids), model(ids))
        assert (torch.from_numpy(logits) - model(ids)).abs().max() <= 1e-4


@pytest.fixture(scope="module")
def rope_gpt(world) -> Path:
    return save_folder(tiny_model("gpt", "rope"), world["root"] / "rope_gpt")


# (arguments, fragments of the one error line); {vit}, {gpt}, {clip}, {rope_gpt}, {root} filled in.
BAD = [
    (["mode=predict", "ckpt_path={vit}"], ["mode=predict needs inputs="]),
    (["mode=predict", "ckpt_path={vit}", "inputs={root}/nothing.png"], ["nothing.png", "names no image"]),
    (["mode=predict", "inputs={root}"], ["mode=predict needs ckpt_path="]),
    (["model=gpt", "mode=predict", "ckpt_path={gpt}", "inputs={root}"], ["mode=predict is for model=vit", "gpt model"]),
    (["mode=predict", "ckpt_path={rope_gpt}", "inputs={root}"], ["is for model=vit", "holds a gpt model"]),
    (["model=vit", "mode=export", "ckpt_path={rope_gpt}"], ["holds a gpt model, not a vit one", "pass model=gpt"]),
    (["mode=predict", "ckpt_path={vit}", "inputs={root}", "top_k=0"], ["top_k must be a positive int"]),
    (["mode=export", "ckpt_path={vit}", "format=zip"], ["unknown format 'zip'", "huggingface, onnx, safetensors"]),
    (["model=clip", "mode=export", "ckpt_path={clip}", "format=onnx"],
     ["format=onnx supports model=gpt | sequence_classifier | vit, not model=clip"]),
    (["model=gpt", "mode=export", "ckpt_path={rope_gpt}", "format=huggingface"],
     ["format=huggingface", "rope=True", "supported: attention=full without rope, position_bias or kv_heads"]),
    (["model=clip", "mode=retrieve", "ckpt_path={clip}", "inputs={root}"], ["mode=retrieve needs query="]),
    (["model=clip", "mode=zero_shot", "ckpt_path={clip}", "inputs={root}", "templates=[no label here]"],
     ["{label}", "'no label here'"]),
    (["model=clip", "mode=zero_shot", "ckpt_path={clip}", "inputs={root}", "classes=[]"],
     ["classes=[] is empty", "classes=[<class name>,...] or leave it out"]),
    (["model=clip", "mode=zero_shot", "ckpt_path={clip}", "inputs={root}", "templates=[]"],
     ["templates=[] is empty", "leave it out"]),
    (["model=clip", "mode=retrieve", "ckpt_path={clip}", "query={root}/a.png", "inputs={root}"],
     ["image query", "needs captions=[<caption>,...]", 'query="<a caption>" inputs=<images>']),
    (["model=clip", "mode=retrieve", "ckpt_path={clip}", "query={root}/a.png"], ["needs captions="]),
    (["model=gpt", "mode=attention_maps", "ckpt_path={gpt}", "prompt=" + "x" * 17], ["17 tokens", "block_size=16"]),
    (["model=sequence_classifier", "mode=attention_maps", "ckpt_path={sequence_classifier}"],
     ["mode=attention_maps is for model=vit | clip | gpt | translation", "holds a sequence_classifier model"]),
]  # fmt: skip


@pytest.mark.parametrize(("args", "fragments"), BAD, ids=[" ".join(a[1:3]) for a, _ in BAD])
def test_bad_input_gets_one_line_and_exit_status_2(world, rope_gpt, args, fragments, capsys) -> None:
    (world["root"] / "a.png").write_bytes(b"")  # a folder with an image name in it, for the errors after inputs
    names = {k: str(v) for k, v in world.items() if isinstance(v, Path)} | {"rope_gpt": str(rope_gpt)}
    args = [a.format(**names) for a in args]
    code, out, err = run_in_process([*args, *QUIET, f"hydra.run.dir={world['root'] / 'bad'}"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (out + err)[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
