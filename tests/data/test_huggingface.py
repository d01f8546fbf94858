"""data=hf_*: tiny Hugging Face datasets built here with `datasets` (save_to_disk and parquet) train every family
one batch; a hub name offline and a missing column are one line each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_in_process
from zoo.data.huggingface import HFTextDataModule, load_local_dataset
from zoo.errors import DataError

datasets = pytest.importorskip("datasets")

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "runs", "far", "away"]


def images(count: int, seed: int = 0) -> list:
    from PIL import Image

    generator = np.random.default_rng(seed)
    return [Image.fromarray(generator.integers(0, 256, (12, 12, 3), dtype=np.uint8)) for _ in range(count)]


def sentences(count: int, seed: int = 0) -> list[str]:
    generator = np.random.default_rng(seed)
    return [" ".join(generator.choice(WORDS, size=int(generator.integers(3, 9)))) for _ in range(count)]


def text_dataset(folder: Path, parquet: bool = False) -> Path:
    data = datasets.Dataset.from_dict({"text": sentences(200), "id": list(range(200))})
    if parquet:
        folder.mkdir(parents=True)
        data.to_parquet(str(folder / "train.parquet"))
        return folder
    data.save_to_disk(str(folder))
    return folder


def image_dataset(folder: Path, parquet: bool = False) -> Path:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    splits = {
        split: datasets.Dataset.from_dict({"image": images(n, seed), "label": [i % 3 for i in range(n)]}, features)
        for split, n, seed in (("train", 30, 0), ("test", 9, 1))
    }
    if parquet:
        folder.mkdir(parents=True)
        for split, data in splits.items():
            data.to_parquet(str(folder / f"{split}.parquet"))
        return folder
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def caption_dataset(folder: Path) -> Path:
    features = datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")})
    data = datasets.Dataset.from_dict({"image": images(40), "caption": sentences(40)}, features)
    data.save_to_disk(str(folder))
    return folder


def parallel_dataset(folder: Path) -> Path:
    pairs = [{"de": s, "en": s.upper()} for s in sentences(80)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": pairs})}).save_to_disk(str(folder))
    return folder


def run(args: list[str], tmp_path: Path, capsys) -> None:
    code, out, err = run_in_process(
        [*args, "trainer.fast_dev_run=true", "print_config=false", f"hydra.run.dir={tmp_path / 'run'}",
         f"paths.data_dir={tmp_path / 'data'}", "logger=csv"],
        capsys,
    )  # fmt: skip
    assert code == 0, (out + err)[-3000:]


@pytest.mark.parametrize("parquet", [False, True], ids=["save_to_disk", "parquet"])
def test_gpt_trains_on_a_text_dataset(tmp_path, capsys, parquet):
    folder = text_dataset(tmp_path / "text", parquet)
    run(["model=gpt", "data=hf_text", f"data.path={folder}", "data.packing=true"], tmp_path, capsys)


@pytest.mark.parametrize("parquet", [False, True], ids=["save_to_disk", "parquet"])
def test_vit_trains_on_an_image_dataset(tmp_path, capsys, parquet):
    folder = image_dataset(tmp_path / "images", parquet)
    run(["model=vit", "data=hf_images", f"data.path={folder}", "data.num_classes=3", "data.image_size=8",
         "data.batch_size=8", "data.num_workers=0"], tmp_path, capsys)  # fmt: skip


def test_clip_trains_on_a_caption_dataset(tmp_path, capsys):
    folder = caption_dataset(tmp_path / "captions")
    run(["model=clip", "data=hf_captions", f"data.path={folder}", "data.image_size=16", "data.vocab_size=300",
         "data.batch_size=8", "data.num_workers=0", "model_metric.name=val/loss", "model_metric.mode=min"],
        tmp_path, capsys)  # fmt: skip


def test_translation_trains_on_a_parallel_dataset(tmp_path, capsys):
    folder = parallel_dataset(tmp_path / "pairs")
    columns = ["data.source_column=translation.de", "data.target_column=translation.en"]
    run(["model=translation", "data=hf_parallel_text", f"data.path={folder}", *columns, "data.vocab_size=300",
         "data.min_frequency=1"], tmp_path, capsys)  # fmt: skip


def test_splits_come_from_file_names_and_features_survive_parquet(tmp_path):
    splits = load_local_dataset(image_dataset(tmp_path / "images", parquet=True))
    assert sorted(splits) == ["test", "train"] and len(splits["train"]) == 30
    assert splits["train"].features["label"].names == ["a", "b", "c"]


def test_a_hub_name_offline_is_one_line_saying_how_to_pass_a_folder():
    with pytest.raises(DataError, match=r"save_to_disk\('<folder>'\) and pass data.path=<folder>") as error:
        load_local_dataset("stanfordnlp/imdb")
    assert "\n" not in str(error.value) and "offline" in str(error.value)


def test_a_missing_column_names_the_valid_columns(tmp_path):
    module = HFTextDataModule(path=str(text_dataset(tmp_path / "text")), text_column="content", cache_dir=None)
    with pytest.raises(
        DataError, match=r"data.text_column='content' is not a column of .*; valid columns: \['text', 'id'\]"
    ):
        module.setup()
