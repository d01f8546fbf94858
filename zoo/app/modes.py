"""The run modes of `python run.py mode=<name>`: one explicit table, name -> function(cfg) -> metrics.

train      fit, then test the best (or last) checkpoint        every model (zoo.app.pipeline)
generate   sample text from a GPT checkpoint                   model=gpt
translate  translate sentences with a translation checkpoint   model=translation
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig

from zoo.app.pipeline import train_and_test
from zoo.data.parallel_text import decode_ids, encode_sources, pad_sequences
from zoo.models.gpt import SamplingConfig
from zoo.models.translation import beam_search, greedy_decode
from zoo.tasks.language_model import generate_text, load_language_model
from zoo.tasks.translation import alignment_figure, load_translator


def generate(cfg: DictConfig) -> dict[str, float]:
    """`python run.py model=gpt mode=generate ckpt_path=... prompt="ROMEO:" max_new_tokens=300`: prints text."""
    if not cfg.get("ckpt_path"):
        raise ValueError("mode=generate needs ckpt_path=<a checkpoint written by `python run.py model=gpt`>")
    model, tokenizer = load_language_model(cfg.ckpt_path)
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.get("seed") is not None else None
    sampling = SamplingConfig(
        max_new_tokens=int(cfg.max_new_tokens), temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p
    )
    print(generate_text(model, tokenizer, str(cfg.prompt), sampling, generator=generator))
    return {}


def translate(cfg: DictConfig) -> dict[str, float]:
    """Translate `text` (a string or a list of strings) with the checkpoint at `ckpt_path`; prints each
    translation and saves the cross-attention alignment of the first as alignment.png in the run dir."""
    text = cfg.get("text")
    if not text:
        raise ValueError('mode=translate needs text="<sentence to translate>"')
    if not cfg.get("ckpt_path"):
        raise ValueError("mode=translate needs ckpt_path=<a checkpoint written by `python run.py model=translation`>")
    texts = [text] if isinstance(text, str) else [str(t) for t in text]
    net, tokenizer, hparams = load_translator(cfg.ckpt_path)
    beam_size = int(cfg.model.get("beam_size", hparams.get("beam_size", 5)))
    length_penalty = float(cfg.model.get("length_penalty", hparams.get("length_penalty", 1.0)))
    options = dict(max_len_a=hparams.get("max_len_a", 1.2), max_len_b=hparams.get("max_len_b", 10))
    src = pad_sequences(encode_sources(tokenizer, texts, net.config.max_length), net.config.pad_id)
    if beam_size == 1:
        outputs = greedy_decode(net, src, **options)
    else:
        outputs = beam_search(net, src, beam_size, length_penalty, **options)
    for source, ids in zip(texts, outputs):
        print(f"{source}\n  -> {decode_ids(tokenizer, ids)}")
    output_dir = cfg.get("paths", {}).get("output_dir")
    if output_dir:
        source_ids = [i for i in src[0].tolist() if i != net.config.pad_id]
        figure = alignment_figure(net, tokenizer, source_ids, outputs[0], f"beam {beam_size}")
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        figure.savefig(Path(output_dir) / "alignment.png")
    return {}


MODES: dict[str, Callable[[DictConfig], dict[str, float]]] = {
    "train": train_and_test,
    "generate": generate,
    "translate": translate,
}
