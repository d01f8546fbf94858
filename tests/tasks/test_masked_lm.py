"""The masked language model task: BERT's masking against a hand computation and within binomial bounds of its
rates over many tokens (special tokens and padding never chosen, labels -100 elsewhere), [CLS] text [SEP] framing,
val/loss and val/mlm_acc as the cross-entropy and accuracy of the chosen tokens computed by hand, the checkpoint
restoring network and tokenizer, and the data's tokenizer refused without BERT's tokens."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch

import zoo
from tests.helpers import as_checkpoint, run_in_process, tiny_model
from zoo.data.text import TextDataModule
from zoo.data.tokenizers import CLS, MASK, MASKED_LM_TOKENS, PAD, SEP
from zoo.errors import DataError
from zoo.models.bert import BERT
from zoo.tasks.masked_lm import IGNORE_INDEX, MaskedLMTask, MaskingConfig, fill_masks, mask_tokens

TEXT = "".join(
    f"ROMEO: {'what light through yonder window breaks' if i % 2 else 'it is the east'}.\n" for i in range(300)
)
NET = {"vocab_size": None, "max_length": None, "dim": 32, "depth": 2, "num_heads": 2, "dropout": 0.0}


def test_mask_tokens_matches_a_hand_computation() -> None:
    token_ids = torch.tensor([[1, 10, 11, 12, 13, 2], [1, 14, 15, 0, 0, 0]])
    maskable = torch.tensor([[False, True, True, True, True, False], [False, True, True, False, False, False]])
    replacements = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    masking = MaskingConfig(rate=0.5, mask_rate=0.5, random_rate=0.25)
    inputs, labels = mask_tokens(token_ids, maskable, 3, replacements, masking, torch.Generator().manual_seed(7))

    generator = torch.Generator().manual_seed(7)  # the draws, in the documented order
    chosen_draw = torch.rand(2, 6, generator=generator).tolist()
    action_draw = torch.rand(2, 6, generator=generator).tolist()
    index_draw = torch.randint(7, (2, 6), generator=generator).tolist()
    for b in range(2):
        for t in range(6):
            token = int(token_ids[b, t])
            chosen = maskable[b, t] and chosen_draw[b][t] < 0.5
            if not chosen:
                expected_input, expected_label = token, IGNORE_INDEX
            elif action_draw[b][t] < 0.5:
                expected_input, expected_label = 3, token
            elif action_draw[b][t] < 0.75:
                expected_input, expected_label = int(replacements[index_draw[b][t]]), token
            else:
                expected_input, expected_label = token, token
            assert (int(inputs[b, t]), int(labels[b, t])) == (expected_input, expected_label), (b, t)
    assert (labels != IGNORE_INDEX).any()


def test_masking_rates_hold_over_many_tokens_and_special_tokens_are_never_chosen() -> None:
    generator = torch.Generator().manual_seed(0)
    vocabulary, mask_id = 50, 3
    token_ids = torch.randint(4, vocabulary, (400, 256), generator=generator)
    token_ids[:, 0], token_ids[:, -1] = 1, 2  # [CLS] and [SEP]
    token_ids[::3, 200:-1] = 0  # padding
    maskable = token_ids >= 4
    replacements = torch.arange(4, vocabulary)
    inputs, labels = mask_tokens(token_ids, maskable, mask_id, replacements, generator=generator)

    chosen = labels != IGNORE_INDEX
    assert not chosen[~maskable].any() and torch.equal(inputs[~maskable], token_ids[~maskable])
    assert torch.equal(labels[chosen], token_ids[chosen]) and torch.equal(inputs[~chosen], token_ids[~chosen])

    def within_binomial(successes: int, trials: int, p: float) -> bool:  # 5 standard deviations
        return abs(successes - trials * p) <= 5 * math.sqrt(trials * p * (1 - p))

    n, k = int(maskable.sum()), int(chosen.sum())
    assert within_binomial(k, n, 0.15)
    masked = int((inputs[chosen] == mask_id).sum())
    changed = inputs[chosen] != token_ids[chosen]
    random = int((changed & (inputs[chosen] != mask_id)).sum())
    # A random replacement equal to the original token (1 in 46) reads as kept.
    p_random_seen = 0.1 * (1 - 1 / len(replacements))
    assert within_binomial(masked, k, 0.8) and within_binomial(random, k, p_random_seen)
    assert within_binomial(k - masked - random, k, 1 - 0.8 - p_random_seen)
    assert torch.isin(inputs[chosen & (inputs != mask_id)], replacements).all()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rate": 1.5}, r"model.masking.rate must be a number in \[0, 1\], got 1.5"),
        ({"rate": 0.0}, "model.masking.rate must be above 0"),
        ({"mask_rate": 0.9, "random_rate": 0.2}, "model.masking.mask_rate \\+ random_rate must be at most 1"),
    ],
)
def test_bad_masking_is_a_one_line_error(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MaskingConfig(**settings)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "play.txt"
    path.write_text(TEXT)
    return path


def data_module(corpus: Path, special_tokens=MASKED_LM_TOKENS) -> TextDataModule:
    return TextDataModule(
        path=str(corpus), block_size=30, batch_size=8, eval_batches=2, eval_batch_size=8, special_tokens=special_tokens
    )


def test_training_reports_the_cross_entropy_and_accuracy_of_the_chosen_tokens(corpus: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = data_module(corpus)
    task = MaskedLMTask(net=dict(NET), optimizer={"lr": 3e-3}, scheduler={"warmup_steps": 2})
    trainer = L.Trainer(
        max_steps=6, val_check_interval=3, check_val_every_n_epoch=None, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path),
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), monitor="val/loss")],
    )  # fmt: skip
    trainer.fit(task, datamodule=data)
    tokenizer = data.tokenizer
    config = task.net.config
    assert config.vocab_size == tokenizer.get_vocab_size() and config.max_length == 32
    assert config.padding_id == tokenizer.token_to_id(PAD) and task.hparams.net["vocab_size"] == config.vocab_size

    metrics = trainer.validate(task, datamodule=data, verbose=False)[0]
    total, correct, count = 0.0, 0, 0
    special = {tokenizer.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>", *MASKED_LM_TOKENS)}
    net = task.net.eval()
    with torch.no_grad():
        for index, (x, _) in enumerate(data.val_dataloader()):
            inputs, labels = task.masked_batch(x, torch.Generator().manual_seed(index))
            assert (inputs[:, 0] == tokenizer.token_to_id(CLS)).all() and (
                inputs[:, -1] == tokenizer.token_to_id(SEP)
            ).all()
            assert torch.equal(inputs[:, 1:-1][labels[:, 1:-1] == IGNORE_INDEX], x[labels[:, 1:-1] == IGNORE_INDEX])
            chosen = labels != IGNORE_INDEX
            assert not any(int(t) in special for t in labels[chosen])
            logits = net(inputs)[chosen]
            total += float(torch.nn.functional.cross_entropy(logits, labels[chosen], reduction="sum"))
            correct += int((logits.argmax(-1) == labels[chosen]).sum())
            count += int(chosen.sum())
    assert count > 0
    assert metrics["val/loss"] == pytest.approx(total / count, rel=1e-5)
    assert metrics["val/mlm_acc"] == pytest.approx(correct / count, rel=1e-5)
    assert trainer.validate(task, datamodule=data, verbose=False)[0] == metrics  # the same masks every time

    model = zoo.load(trainer.checkpoint_callback.best_model_path)
    assert isinstance(model, BERT) and model.tokenizer.to_str() == tokenizer.to_str()
    x, _ = next(iter(data.val_dataloader()))
    with torch.no_grad():
        torch.testing.assert_close(model(task.frame(x)), net(task.frame(x)))
    assert tokenizer.encode(f"the {MASK} is").ids.count(tokenizer.token_to_id(MASK)) == 1


def test_a_tokenizer_without_berts_tokens_is_refused_in_one_line(corpus: Path) -> None:
    data = data_module(corpus, special_tokens=())
    data.setup()
    with pytest.raises(DataError, match=r"the data's tokenizer has no \[MASK\] \[CLS\] \[SEP\]: .*data.special_tokens"):
        MaskedLMTask(net=dict(NET)).take_data(data)


def test_fill_masks_ranks_the_tokens_of_each_mask_by_the_models_probabilities() -> None:
    model = tiny_model("bert")
    tokenizer = model.tokenizer
    candidates = fill_masks(model, tokenizer, "the [MASK]ox [MASK]", k=3)
    ids = [tokenizer.token_to_id(t) for t in (CLS, *"the ", MASK, *"ox ", MASK, SEP)]
    with torch.no_grad():
        probabilities = model(torch.tensor([ids]))[0].softmax(-1)
    assert len(candidates) == 2
    for position, mask in zip((5, 9), candidates):
        values, indices = probabilities[position].topk(3)
        assert [token for token, _ in mask] == [tokenizer.id_to_token(int(i)) for i in indices]
        assert [p for _, p in mask] == pytest.approx(values.tolist(), abs=1e-6)
    with pytest.raises(ValueError, match=r"'the fox' has no \[MASK\]; write it where a token is to be predicted"):
        fill_masks(model, tokenizer, "the fox")
    with pytest.raises(ValueError, match="is 17 tokens long, more than the model's 16"):
        fill_masks(model, tokenizer, "the [MASK]" + " " * 12)


def test_mode_predict_fills_the_masks_of_a_checkpoint(tmp_path: Path, capsys) -> None:
    checkpoint = as_checkpoint(tiny_model("bert"), tmp_path / "bert.ckpt")
    args = ["model=bert", "mode=predict", f"ckpt_path={checkpoint}", 'inputs="the [MASK]ox"', "top_k=2"]
    code, out, err = run_in_process([*args, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 0, (out + err)[-3000:]
    rows = (tmp_path / "run" / "predictions.csv").read_text().splitlines()
    best = fill_masks(zoo.load(checkpoint), zoo.load(checkpoint).tokenizer, "the [MASK]ox", k=2)[0]
    assert rows[0] == "text,mask,rank,token,probability" and len(rows) == 3
    assert rows[1].startswith(f"the [MASK]ox,0,1,{best[0][0]},")
    assert f"-> 'the {best[0][0]}ox'" in out
