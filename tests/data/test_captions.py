"""Caption data: prompt templates, the caption tokenizer (markers, truncation, padding, round trip), captions
for labelled digits, and image-caption pairs read from CSV and JSONL files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from tokenizers import processors
from torchvision.io import write_png

from zoo.data.captions import (
    CaptionFileDataModule,
    LabelledCaptionDataModule,
    encode_captions,
    end_of_text_id,
    fill_templates,
    prepare_caption_tokenizer,
    train_caption_tokenizer,
)
from zoo.data.images import DigitsDataModule
from zoo.data.tokenizers import BOS, EOS, PAD, UNK, tokenizer_from_string, tokenizer_to_string, train_tokenizer
from zoo.errors import DataError

CAPTIONS = ["a photo of a cat.", "a photo of a dog.", "a blurry photo of a T-shirt/top."]


def test_fill_templates_writes_every_class_into_every_template() -> None:
    prompts = fill_templates(["a photo of a {label}.", "the {label}"], ["cat", "ankle boot"])
    assert prompts == [["a photo of a cat.", "a photo of a ankle boot."], ["the cat", "the ankle boot"]]
    with pytest.raises(DataError, match="needs a {label} field"):
        fill_templates(["a photo"], ["cat"])


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_caption_tokenizer_wraps_truncates_keeps_end_of_text_and_pads(kind: str) -> None:
    tokenizer = train_caption_tokenizer(CAPTIONS, kind, vocab_size=300, max_length=8)
    bos, eos, pad = (tokenizer.token_to_id(token) for token in (BOS, EOS, PAD))
    assert end_of_text_id(tokenizer) == eos
    ids = encode_captions(tokenizer, ["a cat", CAPTIONS[2]])
    assert ids.shape == (2, 8)  # the long caption is truncated to max_length
    assert ids[:, 0].tolist() == [bos, bos]
    assert ids[1, -1].item() == eos  # truncation keeps the end-of-text token
    first_end = ids[0].tolist().index(eos)
    assert (ids[0, first_end + 1 :] == pad).all() and first_end < 7
    # The JSON string stored in checkpoints restores the same behaviour.
    restored = tokenizer_from_string(tokenizer_to_string(tokenizer))
    assert torch.equal(encode_captions(restored, ["a cat", CAPTIONS[2]]), ids)


def test_tokenizer_without_pad_token_pads_with_end_of_text() -> None:
    # Like OpenAI's vocabulary: start and end markers, no <pad>.
    tokenizer = train_tokenizer("char", CAPTIONS, special_tokens=(BOS, EOS, UNK))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, tokenizer.token_to_id(BOS)), (EOS, tokenizer.token_to_id(EOS))]
    )
    prepare_caption_tokenizer(tokenizer, max_length=16)
    ids = encode_captions(tokenizer, ["a", "a cat"])
    assert ids.shape == (2, 7)
    assert ids[0, 2:].eq(tokenizer.token_to_id(EOS)).all()


def digits_captions(**overrides) -> LabelledCaptionDataModule:
    images = DigitsDataModule(image_size=8, in_channels=1, augment=False)
    options = {"templates": ["a photo of the number {label}.", "the digit {label}."], "batch_size": 16,
               "max_length": 16, "vocab_size": 300, "image_size": 8, "in_channels": 1, **overrides}  # fmt: skip
    return LabelledCaptionDataModule(images, **options)


def test_digit_captions_name_the_class_of_their_image() -> None:
    datamodule = digits_captions()
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["images"].shape == (16, 1, 8, 8)
    assert batch["tokens"].shape[0] == 16 and batch["tokens"].shape[1] <= 16
    assert torch.equal(batch["labels"], batch["match_ids"])
    for caption, label in zip(batch["captions"], batch["labels"].tolist()):
        assert caption in (f"a photo of the number {label}.", f"the digit {label}.")
    decoded = datamodule.tokenizer.decode(batch["tokens"][0].tolist())
    assert decoded.replace(" ", "") == batch["captions"][0].replace(" ", "")
    assert len(datamodule.zero_shot_prompts()) == 2 and len(datamodule.zero_shot_prompts()[0]) == 10
    # Evaluation captions are deterministic: template i mod T.
    test_batch = next(iter(datamodule.test_dataloader()))
    assert test_batch["captions"][1].startswith("the digit")
    assert len(datamodule.test_set) == 360


def test_prompts_longer_than_max_length_are_an_error_not_a_lost_class_name() -> None:
    datamodule = digits_captions(max_length=6)
    with pytest.raises(DataError, match="'a photo of the number 0.' is longer than data.max_length=6"):
        datamodule.setup()


def test_labelled_captions_reject_disagreeing_image_size() -> None:
    with pytest.raises(DataError, match="data.image_size=16 disagrees with data.images.image_size=8"):
        digits_captions(image_size=16)


def write_images(folder: Path, count: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        image = torch.full((3, 12, 10), 20 * i, dtype=torch.uint8)
        write_png(image, str(folder / f"img{i}.png"))
        names.append(f"img{i}.png")
    return names


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_caption_file_pairs_split_by_image(tmp_path: Path, fmt: str) -> None:
    names = write_images(tmp_path / "images", 10)
    rows = [(name, f"picture number {i} variant {j}") for i, name in enumerate(names) for j in range(2)]
    pairs = tmp_path / f"pairs.{fmt}"
    if fmt == "csv":
        with pairs.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["image", "caption"])
            writer.writerows(rows)
    else:
        pairs.write_text("".join(json.dumps({"image": image, "caption": text}) + "\n" for image, text in rows))
    datamodule = CaptionFileDataModule(
        str(pairs), image_root=str(tmp_path / "images"), image_size=8, patch_size=4, batch_size=4,
        val_fraction=0.2, test_fraction=0.2, vocab_size=300,
    )  # fmt: skip
    datamodule.setup()
    splits = [datamodule.train_set, datamodule.val_set, datamodule.test_set]
    assert [len(split) for split in splits] == [12, 4, 4]  # 6 / 2 / 2 images, 2 captions each
    images_of = [{row[0] for row in split.rows} for split in splits]
    assert not (images_of[0] & images_of[1]) and not (images_of[0] & images_of[2]) and not (images_of[1] & images_of[2])
    batch = next(iter(datamodule.test_dataloader()))
    assert batch["images"].shape == (4, 3, 8, 8) and batch["images"].dtype == torch.float32
    assert (batch["labels"] == -1).all() and datamodule.zero_shot_prompts() == []
    # Both captions of an image share its match id; the image index names it.
    for caption, match_id in zip(batch["captions"], batch["match_ids"].tolist()):
        assert caption.startswith(f"picture number {match_id} ")
    assert datamodule.tokenizer_captions() and all(c.startswith("picture") for c in datamodule.tokenizer_captions())


def test_caption_file_errors_are_one_line_and_name_the_problem(tmp_path: Path) -> None:
    names = write_images(tmp_path, 3)
    bad_columns = tmp_path / "bad.csv"
    bad_columns.write_text("path,text\n" + "".join(f"{n},a caption\n" for n in names))
    with pytest.raises(DataError, match=r"lacks \['image', 'caption'\] \(found \['path', 'text'\]\)"):
        CaptionFileDataModule(str(bad_columns)).setup()
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"image": "nowhere.png", "caption": "x"}) + "\n")
    with pytest.raises(DataError, match="1 images listed in data.pairs_file are not under"):
        CaptionFileDataModule(str(missing)).setup()
    with pytest.raises(DataError, match="must end in .csv or .jsonl"):
        CaptionFileDataModule(str(tmp_path / "img0.png")).setup()
    with pytest.raises(DataError, match="val_fraction must be in"):
        CaptionFileDataModule(str(bad_columns), val_fraction=0.0)
