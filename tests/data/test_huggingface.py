"""data=hf_*: tiny Hugging Face datasets built here with `datasets` (save_to_disk and parquet) train every family
one batch; a hub name offline and a missing column are one line each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_in_process
from zoo.data.huggingface import HFSequenceDataModule, HFTextDataModule, load_local_dataset
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


def sequence_dataset(folder: Path, text: bool = True) -> Path:
    """Two classes: text rows (strings, string labels) or token id rows (ClassLabel), of varying length."""
    generator = np.random.default_rng(0)
    if text:
        rows = sentences(60)
        data = {"tokens": rows, "label": ["long" if len(row) > 25 else "short" for row in rows]}
        datasets.Dataset.from_dict(data).save_to_disk(str(folder))
    else:
        rows = [generator.integers(1, 20, int(generator.integers(4, 12))).tolist() for _ in range(60)]
        features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("int32")),
                                      "label": datasets.ClassLabel(names=["even", "odd"])})  # fmt: skip
        data = datasets.Dataset.from_dict({"tokens": rows, "label": [sum(row) % 2 for row in rows]}, features)
        data.to_parquet(str(folder.with_suffix(".parquet")))
        return folder.with_suffix(".parquet")
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


@pytest.mark.parametrize("model", ["translation", "rnn_translation"])
def test_translation_trains_on_a_parallel_dataset(tmp_path, capsys, model):
    folder = parallel_dataset(tmp_path / "pairs")
    columns = ["data.source_column=translation.de", "data.target_column=translation.en"]
    run([f"model={model}", "data=hf_parallel_text", f"data.path={folder}", *columns, "data.vocab_size=300",
         "data.min_frequency=1"], tmp_path, capsys)  # fmt: skip


@pytest.mark.parametrize("text", [False, True], ids=["token_ids", "text"])
def test_sequence_classifier_trains_on_a_sequence_dataset(tmp_path, capsys, text):
    folder = sequence_dataset(tmp_path / "sequences", text)
    vocabulary = [] if text else ["data.vocab_size=20", "data.packing=true", "model.net.pool=mean"]
    run(["model=sequence_classifier", "data=hf_sequences", f"data.path={folder}", "data.num_classes=2",
         "data.max_length=48", "data.batch_size=8", *vocabulary], tmp_path, capsys)  # fmt: skip


def test_text_sequences_are_their_bytes_plus_one_padded_with_zero_and_labels_name_the_classes(tmp_path):
    folder = sequence_dataset(tmp_path / "sequences", text=True)
    module = HFSequenceDataModule(path=str(folder), max_length=64, num_classes=2, padding_id=0, vocab_size=257)
    module.setup()
    assert module.classes == ("long", "short")
    rows = datasets.load_from_disk(str(folder))["tokens"]
    tokens, labels = module.splits["train"].tensors
    for ids, label in zip(tokens, labels):
        row = bytes(t - 1 for t in ids.tolist() if t).decode()
        assert row in rows and int((ids != 0).sum()) == len(row.encode()) and ids[-1] == 0
        assert module.classes[label] == ("long" if len(row) > 25 else "short")
    with pytest.raises(DataError, match=r"data.num_classes=3, but .* has 2 classes \['long', 'short'\]"):
        HFSequenceDataModule(path=str(folder), max_length=64, num_classes=3, padding_id=0).setup()


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


def test_columns_of_the_wrong_kind_name_the_column_what_it_holds_and_what_was_expected(tmp_path):
    from zoo.data.huggingface import HFImageDataModule, HFParallelTextDataModule

    rows = {"image": [f"imgs/{i}.png" for i in range(20)], "label": [i % 2 for i in range(20)]}
    paths = datasets.Dataset.from_dict(rows)
    paths.save_to_disk(str(tmp_path / "paths"))
    with pytest.raises(DataError) as info:
        HFImageDataModule(path=str(tmp_path / "paths"), image_size=8).load()
    assert str(info.value) == (
        f"data.image_column='image' of {tmp_path / 'paths'} holds strings (e.g. 'imgs/0.png'), not images "
        "(file paths: cast the column with datasets.Image() before save_to_disk)"
    )

    folder = sequence_dataset(tmp_path / "sequences", text=False)
    with pytest.raises(DataError, match=r"^data.sequence_column='label' of .* holds ints \(e.g. \d\), not token "
                                        r"sequences \(lists of token ids, or strings\)$"):  # fmt: skip
        HFSequenceDataModule(path=str(folder), sequence_column="label", max_length=8, num_classes=2, padding_id=0,
                             vocab_size=32).setup()  # fmt: skip

    pairs = parallel_dataset(tmp_path / "pairs")
    with pytest.raises(DataError, match=r"^data.target_column='translation.fr': column 'translation' of .* holds "
                                        r"dicts with keys \['de', 'en'\], with no key 'fr'; valid: translation.de, "
                                        r"translation.en$"):  # fmt: skip
        HFParallelTextDataModule(path=str(pairs), source_column="translation.de", target_column="translation.fr").load()
    with pytest.raises(DataError, match=r"holds dicts with keys \['de', 'en'\], not text; name a key: translation.de"):
        HFParallelTextDataModule(path=str(pairs), source_column="translation", target_column="translation.en").load()
    assert len(HFParallelTextDataModule(path=str(pairs), source_column="translation.de",
                                        target_column="translation.en").load()["train"][0]) > 0  # fmt: skip
