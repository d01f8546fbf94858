"""The RNN encoder-decoder: teacher forcing and step-by-step decoding agree, beam search over the recurrent state
returns what the teacher-forced model scores, padding does not leak, attention is the shared core's, and bad
settings are one-line errors naming the choices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.attention import MultiHeadAttention
from zoo.models.rnn_translation import RNNTranslation, RNNTranslationConfig
from zoo.models.seq2seq import Seq2SeqModel, beam_search, greedy_decode
from zoo.models.translation import TranslationTransformer

PAD, BOS, EOS = 0, 1, 2
CASES = [(cell, attention) for cell in ("gru", "lstm") for attention in (None, "full", "additive")]
IDS = [f"{cell}-{attention or 'fixed'}" for cell, attention in CASES]


def tiny(cell: str = "gru", attention: str | None = "additive", layers: int = 2, seed: int = 0) -> RNNTranslation:
    torch.manual_seed(seed)
    config = RNNTranslationConfig(
        vocab_size=40, embed_dim=12, hidden=16, layers=layers, cell=cell, attention=attention, dropout=0.0,
        max_length=32,
    )  # fmt: skip
    model = RNNTranslation(config).double().eval()
    with torch.no_grad():  # sharper distributions than a fresh init, so search decisions are not near-ties
        model.output.weight.mul_(8.0)
    return model


def random_source(batch: int = 3, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (batch, 7), generator=generator)
    for row, length in ((1, 5), (2, 3)):  # shorter sentences
        if row < batch:
            src[row, length:] = PAD
    return src


def sequence_logprob(model, src: torch.Tensor, ids: list[int]) -> float:
    tgt = torch.tensor([[BOS] + ids + [EOS]])
    logprobs = F.log_softmax(model(src, tgt[:, :-1]).double(), dim=-1)
    return float(logprobs[0].gather(1, tgt[0, 1:, None]).sum().detach())


def test_both_families_implement_the_one_search_interface() -> None:
    from zoo.models.translation import TranslationConfig

    transformer = TranslationTransformer(TranslationConfig(vocab_size=40, dim=16, num_heads=2, mlp_dim=32))
    assert isinstance(tiny(), Seq2SeqModel) and isinstance(transformer, Seq2SeqModel)
    assert isinstance(tiny().attention, MultiHeadAttention)  # the shared core's attention, one head
    assert tiny().attention.num_heads == 1 and tiny().attention.variant == "additive"
    assert tiny(attention="full").attention.variant == "full"
    assert tiny(attention=None).attention is None


@pytest.mark.parametrize(("cell", "attention"), CASES, ids=IDS)
def test_step_by_step_decoding_equals_teacher_forcing(cell: str, attention: str | None) -> None:
    model = tiny(cell, attention)
    src, tgt = random_source(), torch.randint(3, 40, (3, 6))
    full = model(src, tgt)
    state = model.start_decoding(src)
    steps = [model.decode_step(tgt[:, : t + 1], state) for t in range(6)]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-10, rtol=1e-10)
    uncached = model.start_decoding(src, use_cache=False)
    torch.testing.assert_close(model.decode_step(tgt, uncached), full[:, -1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(("cell", "attention"), CASES, ids=IDS)
def test_beam_search_over_recurrent_state_returns_what_teacher_forcing_scores(cell: str, attention) -> None:
    model = tiny(cell, attention)
    src = random_source()
    results = beam_search(model, src, beam_size=3, return_scores=True, max_len_a=0.0, max_len_b=8)
    assert [ids for ids, _ in results] == beam_search(model, src, beam_size=3, use_cache=False, max_len_a=0.0,
                                                       max_len_b=8)  # fmt: skip
    for b, (ids, score) in enumerate(results):
        row = src[b : b + 1]
        row = row[:, : int((row != PAD).sum())]  # the sentence alone, unpadded: padding must not matter
        expected = sequence_logprob(model, row, ids)
        assert abs(expected - score) <= 1e-6 * abs(expected), (b, ids)  # the search sums float32 log-probs
    assert beam_search(model, src, beam_size=1) == greedy_decode(model, src)


def test_beam_search_finds_better_scores_than_greedy_over_recurrent_state() -> None:
    improved = 0
    for seed in range(6):
        model, src = tiny("lstm", "full", seed=seed), random_source(batch=1, seed=seed)
        greedy = greedy_decode(model, src, max_len_a=0.0, max_len_b=8)[0]
        beam = beam_search(model, src, beam_size=4, length_penalty=0.0, max_len_a=0.0, max_len_b=8)[0]
        assert sequence_logprob(model, src, beam) >= sequence_logprob(model, src, greedy) - 1e-9
        improved += sequence_logprob(model, src, beam) > sequence_logprob(model, src, greedy) + 1e-9
    assert improved > 0  # vacuous otherwise


def test_attention_weights_are_one_head_over_real_source_tokens() -> None:
    model = tiny("gru", "additive")
    src, tgt = random_source(), torch.randint(3, 40, (3, 4))
    (weights,) = model.cross_attention_weights(src, tgt)
    assert weights.shape == (3, 1, 4, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 4, dtype=weights.dtype))
    assert (weights[2, :, :, 3:] == 0).all()
    assert tiny(attention=None).cross_attention_weights(src, tgt) == []


def test_the_fixed_vector_sees_the_whole_source_and_attention_rows_differ_from_it() -> None:
    src, tgt = random_source(batch=1), torch.randint(3, 40, (1, 4))
    changed = src.clone()
    changed[0, 0] = 3 if src[0, 0] != 3 else 4  # the first source word: the encoder must carry it
    for attention in (None, "full", "additive"):
        model = tiny(attention=attention)
        assert not torch.allclose(model(src, tgt), model(changed, tgt))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [2, 3])
def test_the_fixed_vector_is_the_top_layers_final_states_bridged(cell: str, layers: int) -> None:
    """Cho et al. 2014's c, with the bidirectional encoder (the family's only kind): c = tanh(W [h_fwd; h_bwd] + b)
    of the top layer, whose forward final state is its output at the sentence's last real token and whose
    backward final state is its output at the first one (padding excluded). Each layer's decoder start state is
    the same bridge of that layer's own final states, read here from nn.GRU / nn.LSTM run on the sentence alone."""
    model = tiny(cell, None, layers=layers)
    src = random_source()
    encoded, start = model.encode(src)
    hidden = model.config.hidden
    for row in range(src.shape[0]):
        length = int((src[row] != PAD).sum())
        with torch.no_grad():
            outputs, final = model.encoder(model.embed(src[row : row + 1, :length]))  # the sentence alone
        top = outputs[0]  # (length, 2 hidden): the top layer's states, forward then backward
        by_hand = torch.tanh(model.bridge(torch.cat([top[length - 1, :hidden], top[0, hidden:]])))
        torch.testing.assert_close(encoded["context"][row], by_hand, rtol=1e-12, atol=1e-12)
        finals = final if cell == "lstm" else (final,)  # h_n (and the LSTM's c_n): (layers * 2, 1, hidden)
        bridges = (model.bridge, model.cell_bridge) if cell == "lstm" else (model.bridge,)
        starts = start if cell == "lstm" else (start,)
        for state, bridge, begin in zip(finals, bridges, starts):
            for layer in range(layers):
                forward, backward = state[2 * layer, 0], state[2 * layer + 1, 0]
                expected = torch.tanh(bridge(torch.cat([forward, backward])))
                torch.testing.assert_close(begin[layer, row], expected, rtol=1e-12, atol=1e-12)


def test_bad_settings_are_one_line_errors_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown rnn_translation cell 'rnn'; valid choices: gru, lstm"):
        RNNTranslationConfig(cell="rnn")
    with pytest.raises(ValueError) as info:
        RNNTranslationConfig(attention={"variant": "local", "window": 4})
    assert "'local'" in str(info.value) and "full, additive" in str(info.value) and "null" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("attention", "named"),
    [({"variant": "full", "rope": True}, "attention.rope=true (attention=rope)"),
     ({"variant": "additive", "position_bias": "alibi"}, "attention.position_bias=alibi")],
)  # fmt: skip
def test_what_a_cross_attention_would_ignore_is_refused_naming_what_it_takes(attention, named) -> None:
    """RoPE and position biases are self-attention's (positions across two sequences mean nothing): the RNN's only
    attention would run without them, so asking for them is an error, not a silent no-op."""
    with pytest.raises(ValueError) as info:
        RNNTranslationConfig(attention=attention)
    message = str(info.value)
    assert message.startswith(f"{named} would be ignored") and "\n" not in message
    assert "attention=full | additive" in message and "model.net.attention=null" in message
    RNNTranslationConfig(attention={"variant": "additive", "dropout": 0.1, "rope_base": 500.0})  # unused defaults: fine


def test_config_round_trips_through_a_dict() -> None:
    for cell, attention in CASES:
        config = RNNTranslationConfig(cell=cell, attention=attention, vocab_size=40, hidden=8, embed_dim=8)
        again = RNNTranslationConfig.from_dict(config.to_dict())
        assert again == config
        model = RNNTranslation(again)
        assert model.load_state_dict(RNNTranslation(config).state_dict()) is not None


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_recurrence_runs_in_float32_under_bf16_autocast_on_a_cpu_without_native_bf16(cell, monkeypatch) -> None:
    """oneDNN has no bf16 recurrent kernel on such CPUs ("could not create a primitive descriptor"): the cells run in
    float32 there, with the same result as outside autocast; a whole model's step under bf16 autocast works."""
    from zoo.models import rnn_translation

    monkeypatch.setattr(rnn_translation, "native_bf16", lambda device: False)
    torch.manual_seed(0)
    rnn = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(4, 3, batch_first=True)
    x = torch.randn(2, 5, 4)
    expected, _ = rnn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = rnn_translation._recur(rnn, x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    model = RNNTranslation(RNNTranslationConfig(vocab_size=12, embed_dim=8, hidden=8, layers=1, cell=cell))
    src, tgt = torch.randint(4, 12, (2, 6)), torch.randint(4, 12, (2, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    logits.float().sum().backward()
    assert all(p.grad is not None for p in model.encoder.parameters())
