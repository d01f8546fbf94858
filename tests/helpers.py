"""Test helpers: compose zoo's Hydra config in-process, or run `python run.py` for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import zoo.app
from tests.variants import settings_cases, supports

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Set by tests/conftest.py: whether this session runs the end-to-end tier. In the fast tier the helpers below
# refuse to start a run, so a test that tests/tiers.py failed to see as end-to-end fails loudly.
END_TO_END_ALLOWED = True


def end_to_end(helper: str) -> None:
    if not END_TO_END_ALLOWED:
        raise AssertionError(f"{helper} in the fast tier: tests/tiers.py did not see this test as end-to-end")


def compose_config(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """The config `python run.py <overrides>` would see, with run outputs in output_dir."""
    zoo.app.setup()  # the resolvers conf/ uses
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.root_dir = str(ROOT)
            cfg.paths.output_dir = str(output_dir)
            cfg.paths.log_dir = str(output_dir)
            cfg.paths.data_dir = str(output_dir / "data")
    return cfg


def run_cli(
    args: list[str], cwd: Path = ROOT, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python run.py <args>` in a subprocess; returns the completed process (text output)."""
    end_to_end("run_cli")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def run_benchmark(script: str, args: list[str], out: Path, timeout: float = 300) -> dict:
    """Run `python experiments/<script> <args> --json <out>` and return the JSON record it wrote."""
    end_to_end("run_benchmark")
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), *args, "--json", str(out)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start `python run.py <args>` in the background (text pipes for its output)."""
    end_to_end("start")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) once the process, and every process that holds its pipes, has ended."""
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def run_in_process(args: list[str], capsys=None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python run.py <args>`, run in this process through `zoo.app.run`, the
    command line's own code path without a new interpreter per run. Without pytest's capsys (e.g. in a module
    fixture) the output is captured here."""
    end_to_end("run_in_process")
    import contextlib
    import io

    hydra_run = HydraConfig.instance().cfg
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as capture:
        if capsys is None:
            capture.enter_context(contextlib.redirect_stdout(out))
            capture.enter_context(contextlib.redirect_stderr(err))
        try:
            zoo.app.run(args)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        finally:  # the process as the run found it: a sweep's Hydra config read by the next test would make it a job
            HydraConfig.instance().cfg = hydra_run
            GlobalHydra.instance().clear()
    if capsys is not None:
        return code, *capsys.readouterr()
    return code, out.getvalue(), err.getvalue()


# -- tiny stand-ins for the data the experiments read (generated, offline) ---------------------------------
def write_idx(path: Path, array) -> None:
    """An unsigned-byte IDX file (LeCun's MNIST format), gzipped when the name ends in .gz."""
    import gzip

    import numpy as np

    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())


def tiny_fashion_mnist(folder: Path, train: int = 256, test: int = 64) -> Path:
    """Fashion-MNIST's four idx files with random 28x28 images: what data.data_dir points at."""
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    return folder


def tiny_multi30k(folder: Path, pairs: int = 48) -> Path:
    """Multi30k's {train,val,test_2016_flickr}.{de,en}.gz with a few made-up caption pairs."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    german = ["ein Mann", "eine Frau", "zwei Hunde", "ein Kind", "drei Katzen", "ein Pferd"]
    english = ["a man", "a woman", "two dogs", "a child", "three cats", "a horse"]
    verbs = [("läuft", "runs"), ("spielt", "plays"), ("schläft", "sleeps"), ("springt", "jumps")]
    lines = {"de": [], "en": []}
    for i in range(pairs):
        (de_verb, en_verb), subject = verbs[i % len(verbs)], i % len(german)
        lines["de"].append(f"{german[subject]} {de_verb} im Park .")
        lines["en"].append(f"{english[subject]} {en_verb} in the park .")
    for split in ("train", "val", "test_2016_flickr"):
        for lang, text in lines.items():
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("\n".join(text) + "\n")
    return folder


def tiny_text(path: Path, repeats: int = 200) -> Path:
    """A small play-like corpus, the shape of tiny-shakespeare's input.txt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo.\n\n" * repeats)
    return path


def tiny_datasets(root: Path) -> dict[str, Path]:
    """Every file-backed dataset the configs read, generated small under `root`."""
    return {
        "fashion_mnist": tiny_fashion_mnist(root / "fashion-mnist"),
        "multi30k": tiny_multi30k(root / "multi30k"),
        "text": tiny_text(root / "tinyshakespeare" / "input.txt"),
    }


def tiny_data_overrides(cfg: DictConfig, data: dict[str, Path]) -> list[str]:
    """Overrides pointing a composed config's data at the tiny files, by the data module it builds (the image
    module of a caption or pixel-sequence dataset sits under data.images), and making generated data sets small.
    A file-backed module not listed here is an error: a test must not read real data or download."""
    files = {
        "FashionMNISTDataModule": ("data_dir", data["fashion_mnist"]),
        "Multi30kDataModule": ("data_dir", data["multi30k"]),
        "ShakespeareDataModule": ("path", data["text"]),
    }
    generated = {
        "ListOpsDataModule": {"num_train": 64, "num_val": 16, "num_test": 16},  # a few at full length
        # Its 12,800 default pairs (num2words, a BPE trained on them, a beam search over a 4096-token test batch)
        # were most of a translation debug run; tests/data/test_parallel_text.py checks the generator itself.
        "NumbersDataModule": {"num_train": 64, "num_val": 8, "num_test": 8},
    }
    overrides = []
    for prefix, node in (("data", cfg.data), ("data.images", cfg.data.get("images"))):
        if node is None or "_target_" not in node:
            continue
        name = node._target_.rsplit(".", 1)[-1]
        if name in generated:
            overrides += [f"{prefix}.{key}={value}" for key, value in generated[name].items()]
        elif name in files:
            key, path = files[name]
            overrides.append(f"{prefix}.{key}={path}")
        elif "download" in node:
            raise AssertionError(f"{name} reads files or downloads: add tiny generated data for it to tests/helpers.py")
    return overrides


# -- tiny trained-model stand-ins (random weights) for the inference modes and zoo.load --------------------
# Every registered attention kernel with each of its example options (tests/variants.py), and the shared
# fields that change what attention computes (RoPE, the position biases, grouped kv heads), as conf/attention
# writes them.
VARIANTS = {
    **settings_cases(),
    "rope": {"variant": "full", "rope": True},
    "alibi": {"variant": "full", "position_bias": "alibi"},
    "t5": {"variant": "full", "position_bias": "t5", "num_buckets": 8, "max_distance": 16},
    "gqa": {"variant": "full", "kv_heads": 1},
}
FAMILIES = ("vit", "gpt", "translation", "clip", "sequence_classifier", "bert")
CAUSAL_FAMILIES = ("gpt", "translation")  # GPT and the translation decoder attend causally


def variant_runs(family: str, attention: str | dict) -> bool:
    """Whether `attention` runs in `family`. What the definitions refuse: a bidirectional-only kernel mixes past
    and future (not GPT, the translation decoder or CLIP's text tower, which keeps full attention there); a
    position bias measures distances along a sequence (not a ViT's patch grid: CLIP's image tower keeps full
    attention there)."""
    settings = VARIANTS[attention] if isinstance(attention, str) else attention
    causal = family not in CAUSAL_FAMILIES or supports(settings.get("variant", "full"), "causal")
    return causal and not (family == "vit" and "position_bias" in settings)


REFUSED = {(family, name) for family in FAMILIES for name in VARIANTS if not variant_runs(family, name)}


def tiny_model(family: str, attention: str | dict = "full", seed: int = 0) -> torch.nn.Module:
    """A small random network of `family` with the tokenizer / image preprocessing a checkpoint would carry
    attached (as zoo.load returns it), in eval mode. Every parameter is random (the heads too, which training
    starts at zero), so that two networks that differ give different outputs."""
    from zoo.data.captions import end_of_text_id, train_caption_tokenizer
    from zoo.data.preprocessing import ImagePreprocessing
    from zoo.data.tokenizers import MASKED_LM_TOKENS, PAD, SPECIAL_TOKENS, train_char_tokenizer
    from zoo.models.bert import BERT, BERTConfig
    from zoo.models.clip import CLIP, CLIPConfig
    from zoo.models.gpt import GPT, GPTConfig
    from zoo.models.rnn_translation import RNNTranslation, RNNTranslationConfig
    from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
    from zoo.models.translation import TranslationConfig, TranslationTransformer
    from zoo.models.vit import ViT, ViTConfig

    torch.manual_seed(seed)
    settings = VARIANTS[attention] if isinstance(attention, str) else attention
    digits = ImagePreprocessing(8, 1, (0.3,), (0.38,), tuple(str(d) for d in range(10)))
    vit = {"image_size": 8, "patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32}
    vit["attention"] = settings
    tokenizer, preprocessing, extra = None, None, {}
    if family == "vit":
        model, preprocessing = ViT(ViTConfig(**vit, num_classes=10)), digits
    elif family == "gpt":
        tokenizer = train_char_tokenizer(["def main():\n    return f(x) + 1\n"])
        config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=2, n_head=2, n_embd=16,
                           attention=settings)  # fmt: skip
        model = GPT(config)
    elif family == "translation":
        tokenizer = train_char_tokenizer(["eins zwei drei dreihundertvierundzwanzig one two three"])
        config = TranslationConfig(vocab_size=tokenizer.get_vocab_size(), dim=16, encoder_layers=1, decoder_layers=2,
                                   num_heads=2, mlp_dim=32, max_length=32, dropout=0.0, attention=settings)  # fmt: skip
        model, extra = TranslationTransformer(config), {"beam_size": 2, "max_len_a": 1.0, "max_len_b": 4}
    elif family == "rnn_translation":
        tokenizer = train_char_tokenizer(["eins zwei drei dreihundertvierundzwanzig one two three"])
        config = RNNTranslationConfig(vocab_size=tokenizer.get_vocab_size(), embed_dim=16, hidden=16, max_length=32,
                                      dropout=0.0, attention={"variant": "additive"})  # fmt: skip
        model, extra = RNNTranslation(config), {"beam_size": 2, "max_len_a": 1.0, "max_len_b": 4}
    elif family == "clip":
        captions = [f"{template} {d}." for template in ("a photo of the number", "the digit") for d in range(10)]
        tokenizer = train_caption_tokenizer(captions, "char", None, 32)
        text = {"vocab_size": tokenizer.get_vocab_size(), "max_length": 32, "dim": 16, "depth": 1, "num_heads": 2,
                "mlp_dim": 32, "eot_token_id": end_of_text_id(tokenizer)}  # fmt: skip
        text["attention"] = settings if supports(settings.get("variant", "full"), "causal") else {"variant": "full"}
        vit["attention"] = {"variant": "full"} if "position_bias" in settings else settings
        model = CLIP(CLIPConfig(embed_dim=16, image=vit, text=text))
        preprocessing, extra = digits, {"templates": ["a photo of the number {label}."]}
    elif family == "sequence_classifier":
        # ListOps' vocabulary (zoo.data.listops), so the README's ListOps example runs on it
        config = SequenceClassifierConfig(vocab_size=16, max_length=15, num_classes=10, padding_id=0, dim=16, depth=2,
                                          num_heads=2, mlp_dim=32, attention=settings)  # fmt: skip
        model = SequenceClassifier(config)
    elif family == "bert":
        tokenizer = train_char_tokenizer(["the quick brown fox jumps"], SPECIAL_TOKENS + MASKED_LM_TOKENS)
        config = BERTConfig(vocab_size=tokenizer.get_vocab_size(), max_length=18, padding_id=tokenizer.token_to_id(PAD),
                            dim=16, depth=2, num_heads=2, mlp_dim=32, dropout=0.0, attention=settings)  # fmt: skip
        model = BERT(config)
    else:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    head = getattr(model, "head", None)
    if isinstance(head, torch.nn.Linear):
        torch.nn.init.normal_(head.weight, std=0.5)
        torch.nn.init.normal_(head.bias, std=0.1)
    model.tokenizer, model.preprocessing, model.settings = tokenizer, preprocessing, extra
    return model.eval()


TASKS = {
    "vit": "zoo.tasks.classification.ImageClassificationTask",
    "gpt": "zoo.tasks.language_model.LanguageModelTask",
    "translation": "zoo.tasks.translation.TranslationTask",
    "rnn_translation": "zoo.tasks.translation.RNNTranslationTask",
    "clip": "zoo.tasks.clip.CLIPTask",
    "sequence_classifier": "zoo.tasks.classification.SequenceClassificationTask",
    "bert": "zoo.tasks.masked_lm.MaskedLMTask",
}


def as_checkpoint(model: torch.nn.Module, path: Path) -> Path:
    """`model` saved as a Lightning checkpoint of its zoo task would hold it (weights under net., the task's
    hyper-parameters, identity, tokenizer, preprocessing)."""
    checkpoint = {
        "state_dict": {f"net.{key}": value for key, value in model.state_dict().items()},
        "hyper_parameters": {"net": model.config.to_dict(), "optimizer": {"lr": 1e-3}, **model.settings},
        "zoo": {"task": TASKS[model.config.family], "family": model.config.family},
    }
    if model.tokenizer is not None:
        checkpoint["tokenizer"] = model.tokenizer.to_str()
    if model.preprocessing is not None:
        checkpoint["preprocessing"] = model.preprocessing.to_dict()
    if "templates" in model.settings:
        checkpoint["templates"] = model.settings["templates"]
        checkpoint["hyper_parameters"].pop("templates")
    torch.save(checkpoint, path)
    return path
