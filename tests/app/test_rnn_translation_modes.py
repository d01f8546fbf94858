"""The RNN encoder-decoder through the modes the translation Transformer has: mode=translate, mode=attention_maps
(Bahdanau's alignment figure), mode=export and zoo.load, from a checkpoint of its task."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from tests.helpers import as_checkpoint, run_in_process
from zoo.data.tokenizers import train_char_tokenizer
from zoo.models.rnn_translation import RNNTranslation, RNNTranslationConfig
from zoo.models.seq2seq import greedy_decode


def tiny_rnn(attention: str | None) -> RNNTranslation:
    torch.manual_seed(0)
    tokenizer = train_char_tokenizer(["eins zwei drei dreihundertvierundzwanzig one two three"])
    config = RNNTranslationConfig(vocab_size=tokenizer.get_vocab_size(), embed_dim=8, hidden=8, cell="lstm",
                                  attention=attention, dropout=0.0, max_length=32)  # fmt: skip
    model = RNNTranslation(config)
    model.tokenizer, model.preprocessing = tokenizer, None
    model.settings = {"beam_size": 2, "max_len_a": 1.0, "max_len_b": 4}
    return model.eval()


def run(args: list[str], run_dir: Path, capsys) -> tuple[int, str]:
    code, out, err = run_in_process([*args, "print_config=false", f"hydra.run.dir={run_dir}"], capsys)
    return code, out + err


def test_translate_attention_maps_and_export_of_an_rnn_checkpoint(tmp_path, capsys) -> None:
    model = tiny_rnn("additive")
    ckpt = as_checkpoint(model, tmp_path / "rnn.ckpt")
    code, out = run(
        ["model=rnn_translation", "mode=translate", f"ckpt_path={ckpt}", "text=eins"], tmp_path / "t", capsys
    )
    assert code == 0, out[-3000:]
    assert "eins\n  -> " in out and (tmp_path / "t" / "alignment.png").stat().st_size > 0
    args = ["model=rnn_translation", "mode=attention_maps", f"ckpt_path={ckpt}", 'text=["eins zwei",drei]']
    code, out = run(args, tmp_path / "maps", capsys)
    assert code == 0, out[-3000:]
    assert "attention maps of the rnn_translation model (additive attention)" in out
    assert {p.name for p in (tmp_path / "maps" / "attention").iterdir()} == {"alignment0.png", "alignment1.png"}
    code, out = run(["model=rnn_translation", "mode=export", f"ckpt_path={ckpt}"], tmp_path / "e", capsys)
    assert code == 0, out[-3000:]
    loaded = zoo.load(tmp_path / "e" / "export")
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    torch.testing.assert_close(loaded(src, src[:, :3]), model(src, src[:, :3]))
    assert greedy_decode(zoo.load(ckpt), src) == greedy_decode(model, src)


def test_the_fixed_vector_translates_but_has_no_attention_to_draw(tmp_path, capsys) -> None:
    ckpt = as_checkpoint(tiny_rnn(None), tmp_path / "fixed.ckpt")
    code, out = run(
        ["model=rnn_translation", "mode=translate", f"ckpt_path={ckpt}", "text=eins"], tmp_path / "t", capsys
    )
    assert code == 0, out[-3000:]
    assert not (tmp_path / "t" / "alignment.png").exists()
    args = ["model=rnn_translation", "mode=attention_maps", f"ckpt_path={ckpt}", "text=eins"]
    code, out = run(args, tmp_path / "maps", capsys)
    assert code != 0 and "no attention to draw" in out


def test_a_transformer_checkpoint_is_refused_for_model_rnn_translation(tmp_path, capsys) -> None:
    pytest.importorskip("hydra")
    from tests.helpers import tiny_model

    ckpt = as_checkpoint(tiny_model("translation"), tmp_path / "transformer.ckpt")
    code, out = run(
        ["model=rnn_translation", "mode=translate", f"ckpt_path={ckpt}", "text=eins"], tmp_path / "t", capsys
    )
    assert code != 0 and "pass model=translation" in out
