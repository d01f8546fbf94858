"""Streaming shards (zoo/data/shards.py): mode=shard writes every kind of data zoo reads into litdata shards, the
data=*_stream configs train each family from them, each rank and worker reads its own part once per epoch, a
truncated or corrupt shard is one line naming it (or, asked to, skipped and counted)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import run_in_process, tiny_text
from zoo.data.images import DigitsDataModule
from zoo.data.listops import ListOpsDataModule
from zoo.data.shards import StreamingImagesDataModule, StreamingSequencesDataModule, read_meta, write_shards
from zoo.errors import DataError

FAST = ["trainer.fast_dev_run=true", "print_config=false"]


def tiny_parallel_text(folder: Path) -> dict[str, Path]:
    """train/val/test TSVs of made-up word-for-word sentence pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    german, english = ["ein", "zwei", "drei", "haus", "katze", "hund"], ["one", "two", "three", "house", "cat", "dog"]
    files = {}
    for split in ("train", "val", "test"):
        rows = []
        for _ in range(24):
            words = [rng.randrange(6) for _ in range(3)]
            rows.append(" ".join(german[w] for w in words) + "\t" + " ".join(english[w] for w in words))
        files[split] = folder / f"{split}.tsv"
        files[split].write_text("\n".join(rows) + "\n")
    return files


@pytest.fixture(scope="module")
def digit_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits' splits as image shards, several chunks per split."""
    out = tmp_path_factory.mktemp("digits") / "shards"
    write_shards(DigitsDataModule(val_fraction=0.05, test_fraction=0.2, image_size=8, in_channels=1), out, "16KB")
    return out


def index_batch(samples: list[dict]) -> list[int]:
    return [sample["index"] for sample in samples]


def sample_ids(module: StreamingImagesDataModule, split: str) -> list[int]:
    loader = module.stream_loader(split, collate=index_batch)
    return [index for batch in loader for index in batch]


def test_shards_hold_every_sample_once_with_the_data_description(digit_shards: Path) -> None:
    meta = read_meta(digit_shards)
    assert meta["kind"] == "images" and meta["classes"] == [str(d) for d in range(10)]
    assert (meta["image_size"], meta["in_channels"]) == (8, 1)
    train = meta["splits"]["train"]
    assert len(train["chunks"]) > 1
    module = StreamingImagesDataModule(data_dir=str(digit_shards), batch_size=32)
    for split in ("train", "val", "test"):
        ids = sample_ids(module, split)
        assert sorted(ids) == list(range(meta["splits"][split]["items"])), split
    reference = DigitsDataModule(val_fraction=0.05, test_fraction=0.2, image_size=8, in_channels=1)
    reference.setup()
    images, labels = next(iter(module.stream_loader("test")))
    expected = reference.test_set[0][0]
    assert labels[0] == reference.test_set.labels[0] and torch.allclose(images[0], expected, atol=1e-6)


def test_sequence_shards_hold_the_source_tokens_labels_and_sizes(tmp_path: Path) -> None:
    source = ListOpsDataModule(num_train=40, num_val=8, num_test=8, max_length=32, batch_size=8)
    write_shards(source, tmp_path / "shards")
    meta = read_meta(tmp_path / "shards")
    assert meta["kind"] == "sequences" and meta["classes"] == [str(d) for d in range(10)]
    assert (meta["vocab_size"], meta["max_length"], meta["num_classes"], meta["padding_id"]) == (16, 32, 10, 0)
    module = StreamingSequencesDataModule(data_dir=str(tmp_path / "shards"), batch_size=8)
    tokens, labels = next(iter(module.stream_loader("test")))
    expected_tokens, expected_labels = source.splits["test"].tensors
    assert tokens.dtype == torch.long and torch.equal(tokens, expected_tokens.long())
    assert torch.equal(labels, expected_labels)
    with pytest.raises(DataError, match=r"data.max_length=64, but the shards in .* have 32"):
        StreamingSequencesDataModule(data_dir=str(tmp_path / "shards"), max_length=64)


def test_conversion_never_writes_into_a_folder_that_holds_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shards"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_in_process(
        ["mode=shard", "data=digits", f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"], capsys
    )
    assert code == 2 and err.strip() == f"error: out={str(out)!r} exists and is not empty; name a new folder " \
        "(nothing was overwritten)"  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_folder_without_zoo_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="is not a shards folder .*unfinished conversion"):
        StreamingImagesDataModule(data_dir=str(tmp_path))


# -- every family trains from shards with one command -------------------------------------------------------
FAMILIES = {
    "vit": (["model=vit", "data=digits"], ["data=images_stream", "data.patch_size=2"]),
    "clip": (["model=clip", "data=digits_captions"], ["data=captions_stream", "data.patch_size=2"]),
    "gpt": (["model=gpt", "data=text", "data.path={text}"], ["data=text_stream", "data.block_size=16"]),
    "translation": (
        ["model=translation", "data=parallel_text", "data.train={train}", "data.val={val}", "data.test={test}",
         "data.vocab_size=300"],
        ["data=parallel_text_stream", "data.batch_size=8"],
    ),
    "rnn_translation": (
        ["model=rnn_translation", "data=parallel_text", "data.train={train}", "data.val={val}", "data.test={test}",
         "data.vocab_size=300"],
        ["data=parallel_text_stream", "data.batch_size=8"],
    ),
    "sequence_classifier": (  # ListOps: padded sequences, packed from the shards
        ["model=sequence_classifier", "data=listops", "data.num_train=64", "data.num_val=16", "data.num_test=16",
         "data.max_length=32"],
        ["data=sequences_stream", "data.batch_size=16", "data.packing=true", "model.net.pool=mean"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_converts_its_data_and_trains_from_the_shards(family: str, tmp_path: Path, capsys) -> None:
    files = {"text": tiny_text(tmp_path / "corpus.txt"), **tiny_parallel_text(tmp_path / "pairs")}
    convert, train = FAMILIES[family]
    convert = [arg.format(**files) for arg in convert]
    out = tmp_path / "shards"
    code, stdout, err = run_in_process(
        ["mode=shard", *convert, f"out={out}", f"hydra.run.dir={tmp_path / 'c'}"], capsys
    )
    assert code == 0, err[-3000:]
    assert f"shards to {out}" in stdout and (out / "zoo.json").is_file()
    model = convert[0]
    training = [model, *train, f"data.data_dir={out}", *FAST, f"hydra.run.dir={tmp_path / 't'}"]
    code, stdout, err = run_in_process(training, capsys)
    assert code == 0, (stdout + err)[-3000:]
    assert "test/loss" in stdout


# -- faults ---------------------------------------------------------------------------------------------------
def damaged_copy(shards: Path, target: Path, how: str) -> Path:
    """A copy of `shards` whose second training chunk is cut in half (truncated) or has bytes flipped (corrupt)."""
    import shutil

    shutil.copytree(shards, target)
    chunk = sorted((target / "train").glob("chunk-*.bin"))[1]
    data = bytearray(chunk.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    chunk.write_bytes(bytes(data))
    return chunk


@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_a_bad_shard_is_one_line_naming_it_or_skipped_and_counted(digit_shards: Path, tmp_path: Path, how, caplog):
    chunk = damaged_copy(digit_shards, tmp_path / "shards", how)
    options = {"data_dir": str(tmp_path / "shards"), "batch_size": 32, "verify": how == "corrupt"}
    with pytest.raises(DataError, match=rf"^shard {chunk} is {how}"):
        StreamingImagesDataModule(**options).setup()
    module = StreamingImagesDataModule(**options, skip_bad_shards=True)
    module.setup()
    index = json.loads((digit_shards / "train" / "index.json").read_text())
    lost = next(c["chunk_size"] for c in index["chunks"] if c["filename"] == chunk.name)
    assert f"skipping 1 bad shard(s) of {tmp_path / 'shards' / 'train'} ({lost} samples)" in caplog.text
    ids = sample_ids(module, "train")
    assert len(ids) == len(set(ids)) == read_meta(digit_shards)["splits"]["train"]["items"] - lost


def test_a_bit_flipped_shard_of_the_right_size_is_one_line_naming_it_and_the_verify_option(
    digit_shards: Path, tmp_path: Path
) -> None:
    """Without data.verify a chunk is only checked for its size before training; one whose bytes changed fails in
    litdata's decoder (a KeyError, a struct.error, ...), which is checked against the CRC-32s and named."""
    import shutil

    shutil.copytree(digit_shards, tmp_path / "shards")
    chunk = sorted((tmp_path / "shards" / "train").glob("chunk-*.bin"))[1]
    data = bytearray(chunk.read_bytes())
    data[8] ^= 0xFF  # an offset of the chunk's item table: the size is right, the items are not
    chunk.write_bytes(bytes(data))
    module = StreamingImagesDataModule(data_dir=str(tmp_path / "shards"), batch_size=32)
    module.setup()  # the sizes are as written
    with pytest.raises(DataError) as info:
        sample_ids(module, "train")
    message = str(info.value)
    assert message.startswith(f"shard {chunk} is corrupt: CRC-32 differs") and "\n" not in message
    assert "data.verify=true" in message and "data.skip_bad_shards=true" in message
    assert len(sample_ids(StreamingImagesDataModule(data_dir=str(digit_shards), batch_size=32), "train")) > 0


# -- DDP: disjoint parts, the whole split once per epoch ------------------------------------------------------
def read_as_rank(rank: int, world_size: int, shards: str, port: int, out: str, workers: int) -> None:
    # A rank started by spawn would spawn its loader's workers too (each importing this module, every epoch);
    # Lightning starts DDP ranks as new interpreters, whose workers fork, as here.
    mp.set_start_method("fork", force=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    module = StreamingImagesDataModule(data_dir=shards, batch_size=8, num_workers=workers, drop_last=False)
    loader = module.stream_loader("train", collate=index_batch)
    epochs = [[index for batch in loader for index in batch] for _ in range(2)]
    Path(out, f"rank{rank}.json").write_text(json.dumps(epochs))
    dist.destroy_process_group()


@pytest.mark.parametrize("workers", [2])  # two ranks of two workers: four disjoint parts
def test_two_ranks_read_disjoint_parts_whose_union_is_the_split_once_per_epoch(
    digit_shards: Path, tmp_path: Path, workers: int
) -> None:
    port = 29400 + workers + os.getpid() % 500
    mp.start_processes(read_as_rank, args=(2, str(digit_shards), port, str(tmp_path), workers), nprocs=2,
                       start_method="spawn")  # fmt: skip
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    total = read_meta(digit_shards)["splits"]["train"]["items"]
    for epoch in range(2):
        first, second = ranks[0][epoch], ranks[1][epoch]
        assert len(first) == len(set(first)) and len(second) == len(set(second))
        assert not set(first) & set(second), f"epoch {epoch}: ranks share samples"
        assert sorted(first + second) == list(range(total)), f"epoch {epoch}: the union is not the split"
    assert ranks[0][0] != ranks[0][1], "the second epoch is shuffled anew"
