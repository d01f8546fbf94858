"""The translation Transformer: parity with torch.nn.Transformer layers, cached decoding, beam search."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.variants import settings_cases
from zoo.models.seq2seq import beam_search, greedy_decode
from zoo.models.translation import TranslationConfig, TranslationTransformer
from zoo.nn.blocks import TransformerBlock

PAD, BOS, EOS = 0, 1, 2


def tiny(**overrides) -> TranslationTransformer:
    options = dict(
        vocab_size=40, dim=32, encoder_layers=2, decoder_layers=2, num_heads=4, mlp_dim=64, dropout=0.0, max_length=64
    )
    torch.manual_seed(0)
    return TranslationTransformer(TranslationConfig(**{**options, **overrides})).eval()


def random_source(batch: int = 3, length: int = 7, seed: int = 1) -> torch.Tensor:
    """Ids >= 3 ending in EOS, right-padded to different lengths."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (batch, length), generator=generator)
    for row in range(batch):
        end = length - row  # row 0 unpadded, later rows shorter
        src[row, end - 1] = EOS
        src[row, end:] = PAD
    return src


# -- parity with torch.nn ------------------------------------------------------------------------
def copy_encoder_layer(ours: TransformerBlock, ref: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        ours.self_attn.in_proj.weight.copy_(ref.self_attn.in_proj_weight)
        ours.self_attn.in_proj.bias.copy_(ref.self_attn.in_proj_bias)
        ours.self_attn.out_proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        ours.mlp.fc1.load_state_dict(ref.linear1.state_dict())
        ours.mlp.fc2.load_state_dict(ref.linear2.state_dict())
        ours.norm1.load_state_dict(ref.norm1.state_dict())
        ours.norm2.load_state_dict(ref.norm2.state_dict())


def copy_decoder_layer(ours: TransformerBlock, ref: nn.TransformerDecoderLayer) -> None:
    with torch.no_grad():
        ours.self_attn.in_proj.weight.copy_(ref.self_attn.in_proj_weight)
        ours.self_attn.in_proj.bias.copy_(ref.self_attn.in_proj_bias)
        ours.self_attn.out_proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        ours.cross_attn.in_proj.weight.copy_(ref.multihead_attn.in_proj_weight)
        ours.cross_attn.in_proj.bias.copy_(ref.multihead_attn.in_proj_bias)
        ours.cross_attn.out_proj.load_state_dict(ref.multihead_attn.out_proj.state_dict())
        ours.mlp.fc1.load_state_dict(ref.linear1.state_dict())
        ours.mlp.fc2.load_state_dict(ref.linear2.state_dict())
        ours.norm1.load_state_dict(ref.norm1.state_dict())
        ours.norm_cross.load_state_dict(ref.norm2.state_dict())
        ours.norm2.load_state_dict(ref.norm3.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch_transformer_encoder_layer(norm_first: bool) -> None:
    model = tiny(norm_first=norm_first)
    torch.manual_seed(2)
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    copy_encoder_layer(model.encoder[0], ref)
    x = torch.randn(3, 7, 32)
    padding = random_source() == PAD
    ours = model.encoder[0](x, key_padding_mask=padding)
    expected = ref(x, src_key_padding_mask=padding)
    real = ~padding  # torch's fast path may zero padded rows; only real positions are defined
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch_transformer_decoder_layer(norm_first: bool) -> None:
    model = tiny(norm_first=norm_first)
    torch.manual_seed(3)
    ref = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    copy_decoder_layer(model.decoder[0], ref)
    x, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    memory_padding = random_source() == PAD
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    ours = model.decoder[0](x, context=memory, context_padding_mask=memory_padding)
    expected = ref(x, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=memory_padding)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_model_matches_torch_transformer_with_copied_weights(norm_first: bool) -> None:
    """Whole encoder-decoder against nn.Transformer fed the same scaled, position-added embeddings."""
    model = tiny(norm_first=norm_first)
    torch.manual_seed(4)
    ref = nn.Transformer(32, 4, 2, 2, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    for ours, theirs in zip(model.encoder, ref.encoder.layers):
        copy_encoder_layer(ours, theirs)
    for ours, theirs in zip(model.decoder, ref.decoder.layers):
        copy_decoder_layer(ours, theirs)
    if norm_first:
        model.encoder_norm.load_state_dict(ref.encoder.norm.state_dict())
        model.decoder_norm.load_state_dict(ref.decoder.norm.state_dict())
    else:  # nn.Transformer always ends its stacks in a LayerNorm; the paper's post-norm stack does not
        ref.encoder.norm, ref.decoder.norm = nn.Identity(), nn.Identity()
    src, tgt = random_source(), torch.randint(3, 40, (3, 5))

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return model.source_positions(model.embed(ids) * 32**0.5)

    memory_padding = src == PAD
    hidden = ref(
        embed(src),
        embed(tgt),
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
        tgt_is_causal=True,
        src_key_padding_mask=memory_padding,
        memory_key_padding_mask=memory_padding,
    )
    expected = hidden @ model.embed.weight.T  # tied output projection
    torch.testing.assert_close(model(src, tgt), expected, atol=1e-5, rtol=1e-5)


# -- configuration ------------------------------------------------------------------------------
def test_tied_embeddings_share_one_matrix_and_untied_do_not() -> None:
    tied, untied = tiny(tie_embeddings=True), tiny(tie_embeddings=False)
    assert tied.target_embed is tied.embed and tied.output is None
    assert untied.target_embed is not untied.embed and untied.output is not None
    size = 40 * 32
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 2 * size


def test_positions_options_and_errors() -> None:
    assert tiny(positions="learned").source_positions is not tiny(positions="learned").target_positions
    rope = tiny(positions="rope")
    assert rope.source_positions is None and rope.encoder[0].self_attn.rotary is not None
    assert rope.decoder[0].cross_attn.rotary is None  # no rotary positions across sequences
    assert tiny(attention={"rope": True}).config.positions == "rope"
    alibi = tiny(positions="alibi")
    assert alibi.source_positions is None and alibi.config.attention.position_bias == "alibi"
    assert tiny(attention={"position_bias": "t5"}).config.positions == "t5"
    with pytest.raises(ValueError, match="positions='alibi' contradicts attention.position_bias='t5'"):
        tiny(positions="alibi", attention={"position_bias": "t5"})
    with pytest.raises(ValueError, match="unknown positions 'absolute'.*sinusoidal"):
        tiny(positions="absolute")
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        tiny(num_heads=0)


def test_padding_does_not_change_the_real_tokens() -> None:
    model = tiny()
    src = random_source()
    tgt = torch.randint(3, 40, (3, 4))
    batched = model(src, tgt)
    for row in range(3):
        length = int((src[row] != PAD).sum())
        alone = model(src[row : row + 1, :length], tgt[row : row + 1])
        torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_cross_attention_weights_are_distributions_over_real_source_tokens() -> None:
    model = tiny()
    src = random_source()
    weights = model.cross_attention_weights(src, torch.randint(3, 40, (3, 4)))
    assert len(weights) == 2 and weights[-1].shape == (3, 4, 4, 7)  # (B, H, T, S)
    torch.testing.assert_close(weights[-1].sum(-1), torch.ones(3, 4, 4))
    assert weights[-1][src[:, None, None, :].expand_as(weights[-1]) == PAD].abs().max() == 0


# -- decoding -----------------------------------------------------------------------------------
# Every kernel that decodes (the decoder is causal), with its first example; shared settings on full attention.
ATTENTIONS = {
    **settings_cases(decoding=True, first_only=True),
    "rope": {"rope": True},
    "alibi_gqa": {"position_bias": "alibi", "kv_heads": 2},
    "t5": {"position_bias": "t5", "share_bias": False},
}


@pytest.mark.parametrize("attention", list(ATTENTIONS.values()), ids=list(ATTENTIONS))
def test_cached_decoding_equals_uncached(attention: dict) -> None:
    model = tiny(attention=attention)
    src, tgt = random_source(), torch.randint(3, 40, (3, 6))
    full = model(src, tgt)
    padding = src == PAD
    memory = model.encode(src, padding)
    caches = model.new_caches()
    steps = [model.decode(tgt[:, t : t + 1], memory, padding, caches=caches) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert greedy_decode(model, src, use_cache=True) == greedy_decode(model, src, use_cache=False)
    cached = beam_search(model, src, beam_size=3, use_cache=True)
    assert cached == beam_search(model, src, beam_size=3, use_cache=False)


def test_linear_cross_attention_when_asked() -> None:
    model = tiny(cross_attention="linear")
    assert model.decoder[0].cross_attn.variant == "linear"
    src = random_source()
    assert greedy_decode(model, src, use_cache=True) == greedy_decode(model, src, use_cache=False)


def trained_like(model: TranslationTransformer) -> TranslationTransformer:
    """Sharper output distributions than a fresh init, so search decisions are not near-ties."""
    with torch.no_grad():
        model.embed.weight.mul_(6.0)
    return model


def test_beam_size_one_equals_greedy() -> None:
    model = trained_like(tiny())
    src = random_source(batch=4, seed=5)
    assert beam_search(model, src, beam_size=1) == greedy_decode(model, src)


def sequence_logprob(model: TranslationTransformer, src: torch.Tensor, ids: list[int]) -> float:
    tgt = torch.tensor([[BOS] + ids + [EOS]])
    logprobs = F.log_softmax(model(src, tgt[:, :-1]), dim=-1)
    return float(logprobs[0].gather(1, tgt[0, 1:, None]).sum().detach())


def test_beam_search_scores_at_least_as_well_as_greedy() -> None:
    model = trained_like(tiny())
    improved = 0
    for seed in range(6):
        src = random_source(batch=1, seed=seed)
        greedy = greedy_decode(model, src, max_len_a=0.0, max_len_b=8)[0]
        beam = beam_search(model, src, beam_size=4, length_penalty=0.0, max_len_a=0.0, max_len_b=8)[0]
        greedy_score, beam_score = sequence_logprob(model, src, greedy), sequence_logprob(model, src, beam)
        assert beam_score >= greedy_score - 1e-4
        improved += beam_score > greedy_score + 1e-4
    assert improved > 0  # the test would be vacuous if beam never found anything better


def test_decoding_respects_max_length_and_strips_special_tokens() -> None:
    model = tiny()
    src = random_source()
    lengths = (src != PAD).sum(1)
    for outputs in (
        greedy_decode(model, src, max_len_a=0.5, max_len_b=2),
        beam_search(model, src, beam_size=3, max_len_a=0.5, max_len_b=2),
    ):
        for row, ids in enumerate(outputs):
            assert len(ids) + 1 <= int(0.5 * lengths[row] + 2)  # EOS counts against the limit
            assert not {PAD, BOS, EOS} & set(ids)
    with pytest.raises(ValueError, match="beam_size must be a positive int, got 0"):
        beam_search(model, src, beam_size=0)
