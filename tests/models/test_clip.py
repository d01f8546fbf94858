"""CLIP: exact parity with transformers' CLIPModel (both text poolings), loading saved weights, attention
variants on both towers, and the properties of the embeddings and the logit scale."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from zoo.models.clip import CLIP, CLIPConfig, TextTransformerConfig

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, EOS, BOS = 60, 50, 51  # EOS below BOS: pooling at the highest id would pick <bos>, not EOS


def huggingface_clip(eos_token_id: int = EOS, channels: int = 3) -> torch.nn.Module:
    """A small random transformers CLIPModel (quick_gelu, ln_pre, eps 1e-5: OpenAI's choices)."""
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=12, eos_token_id=eos_token_id,
                         bos_token_id=BOS, pad_token_id=0),
        vision_config=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           image_size=8, patch_size=2, num_channels=channels),
        projection_dim=24,
    )  # fmt: skip
    model = transformers.CLIPModel(config).eval()
    with torch.no_grad():  # random non-trivial norms and temperature, so that copying them matters
        for name, param in model.named_parameters():
            if "layer_norm" in name or "layrnorm" in name or "post_layernorm" in name:
                param.add_(0.1 * torch.randn_like(param))
        model.logit_scale.fill_(3.1)
    return model


def captions(eot: int, lengths: tuple[int, ...] = (4, 7, 10, 12), width: int = 12) -> torch.Tensor:
    """<bos> words <eot> then padding (id 0), of the given lengths."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, EOS, (len(lengths), width), generator=generator)
    for row, length in enumerate(lengths):
        ids[row, 0], ids[row, length - 1], ids[row, length:] = BOS, eot, 0
    return ids


@pytest.mark.parametrize("eos_token_id", [EOS, 2], ids=["eot_token", "argmax_legacy"])
def test_clip_matches_huggingface_clip(eos_token_id: int) -> None:
    reference = huggingface_clip(eos_token_id)
    model = CLIP.from_huggingface(reference).eval()
    assert model.config.text.pool == ("argmax" if eos_token_id == 2 else "eot")
    assert model.config.image.activation == "quick_gelu" and model.config.image.pre_norm
    # With the legacy config the end-of-text token must carry the highest id, as in OpenAI's vocabulary.
    tokens = captions(EOS if eos_token_id == EOS else VOCAB - 1)
    images = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        expected = reference(input_ids=tokens, pixel_values=images)
        image_embeddings, text_embeddings, scale = model(images, tokens)
    torch.testing.assert_close(image_embeddings, expected.image_embeds, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(text_embeddings, expected.text_embeds, atol=1e-5, rtol=1e-4)
    logits = scale * image_embeddings @ text_embeddings.T
    torch.testing.assert_close(logits, expected.logits_per_image, atol=1e-4, rtol=1e-4)
    # The unnormalised features equal get_image_features / get_text_features too.
    with torch.no_grad():
        image_features = reference.get_image_features(pixel_values=images).pooler_output
        text_features = reference.get_text_features(input_ids=tokens).pooler_output
        torch.testing.assert_close(model.encode_image(images, normalize=False), image_features, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(model.encode_text(tokens, normalize=False), text_features, atol=1e-5, rtol=1e-4)


def test_from_pretrained_reads_a_save_pretrained_folder_and_a_state_dict_file(tmp_path: Path) -> None:
    reference = huggingface_clip()
    reference.save_pretrained(tmp_path / "folder")
    torch.save(reference.state_dict(), tmp_path / "folder" / "weights.pt")
    images, tokens = torch.randn(2, 3, 8, 8), captions(EOS, (5, 12))
    with torch.no_grad():
        expected = reference(input_ids=tokens, pixel_values=images).logits_per_image
        for source in (tmp_path / "folder", tmp_path / "folder" / "weights.pt"):
            model = CLIP.from_pretrained(source).eval()
            image_embeddings, text_embeddings, scale = model(images, tokens)
            torch.testing.assert_close(scale * image_embeddings @ text_embeddings.T, expected, atol=1e-4, rtol=1e-4)


def test_pretrained_mismatch_names_missing_and_unexpected_keys(tmp_path: Path) -> None:
    reference = huggingface_clip()
    state = reference.state_dict()
    del state["text_projection.weight"]
    state["vision_model.extra.weight"] = torch.zeros(3)
    reference.config.save_pretrained(tmp_path)
    torch.save(state, tmp_path / "weights.pt")
    with pytest.raises(ValueError) as error:
        CLIP.from_pretrained(tmp_path / "weights.pt")
    message = str(error.value)
    assert "\n" not in message
    assert "missing keys (1) ['text_projection.weight']" in message
    assert "unexpected keys (1) ['vision_model.extra.weight']" in message


def test_pretrained_needs_config_and_existing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CLIP.from_pretrained(tmp_path / "nothing")
    torch.save({}, tmp_path / "weights.pt")
    with pytest.raises(FileNotFoundError, match="config.json"):
        CLIP.from_pretrained(tmp_path / "weights.pt")
    (tmp_path / "config.json").write_text(json.dumps(huggingface_clip().config.to_dict()))
    (tmp_path / "junk.pt").write_text("not a tensor file")
    with pytest.raises(ValueError, match="not a readable state dict"):
        CLIP.from_pretrained(tmp_path / "junk.pt")


def test_attention_variants_apply_to_both_towers_after_import() -> None:
    reference = huggingface_clip()
    images, tokens = torch.randn(2, 3, 8, 8), captions(EOS, (6, 12))
    full = CLIP.from_huggingface(reference).eval()
    # A local window covering every token computes exactly full attention: same weights, new kernel.
    local = CLIP.from_huggingface(reference, attention={"variant": "local", "window": 64}).eval()
    linear = CLIP.from_huggingface(reference, attention={"variant": "linear"}).eval()
    rope = CLIP.from_huggingface(reference, attention={"variant": "full", "rope": True}).eval()
    for model, variant in ((local, "local"), (linear, "linear")):
        assert model.image_encoder.blocks[0].self_attn.variant == variant
        assert model.text_encoder.blocks[0].self_attn.variant == variant
        assert model.text_encoder.blocks[0].self_attn.causal
    with torch.no_grad():
        expected = full(images, tokens)
        for got, want in zip(local(images, tokens), expected):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        assert (linear(images, tokens)[0] - expected[0]).abs().max() > 1e-4  # a different architecture
    # RoPE replaces both learned position tables: 2D axial for patches, 1D for text.
    assert rope.image_encoder.pos_embed is None and rope.text_encoder.pos_embed is None
    assert rope.image_encoder.blocks[0].self_attn.rotary.n_axes == 2
    assert rope.text_encoder.blocks[0].self_attn.rotary.n_axes == 1
    torch.testing.assert_close(rope.text_projection.weight, reference.text_projection.weight)


def tiny_clip(**text_overrides) -> CLIP:
    torch.manual_seed(0)
    text = {"vocab_size": 40, "max_length": 10, "dim": 32, "depth": 2, "num_heads": 4, **text_overrides}
    image = {"image_size": 8, "patch_size": 2, "in_channels": 1, "dim": 32, "depth": 2, "num_heads": 4}
    return CLIP(CLIPConfig(embed_dim=16, image=image, text=text)).eval()


def test_embeddings_are_unit_length_and_logit_scale_starts_at_one_over_temperature() -> None:
    model = tiny_clip()
    tokens = torch.tensor([[1, 5, 6, 2, 0, 0], [1, 7, 8, 9, 10, 2]])
    image_embeddings, text_embeddings, scale = model(torch.randn(3, 1, 8, 8), tokens)
    assert image_embeddings.shape == (3, 16) and text_embeddings.shape == (2, 16)
    torch.testing.assert_close(image_embeddings.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(text_embeddings.norm(dim=-1), torch.ones(2))
    assert math.isclose(scale.item(), 1 / 0.07, rel_tol=1e-5)
    with torch.no_grad():
        model.logit_scale.fill_(10.0)
    assert math.isclose(model.scale().item(), 100.0, rel_tol=1e-5)  # clamped at ln(100)


def test_text_embedding_reads_the_first_end_of_text_and_ignores_what_follows() -> None:
    model = tiny_clip()
    short = torch.tensor([[1, 5, 6, 2]])
    padded = torch.tensor([[1, 5, 6, 2, 0, 0, 2, 9]])
    torch.testing.assert_close(model.encode_text(short), model.encode_text(padded))
    assert (model.encode_text(torch.tensor([[1, 5, 7, 2]])) - model.encode_text(short)).abs().max() > 1e-4


def test_text_without_end_of_text_or_too_long_is_an_error() -> None:
    model = tiny_clip()
    with pytest.raises(ValueError, match="end-of-text token id 2"):
        model.encode_text(torch.tensor([[1, 5, 6, 7]]))
    with pytest.raises(ValueError, match="max_length=10"):
        model.encode_text(torch.ones(1, 11, dtype=torch.long))


def test_config_errors_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="valid choices"):
        TextTransformerConfig(pool="mean")
    with pytest.raises(ValueError, match="num_classes must be 0"):
        CLIPConfig(image=CLIPConfig().image.__class__(num_classes=10))
    with pytest.raises(ValueError, match="eot_token_id"):
        TextTransformerConfig(vocab_size=10, eot_token_id=10)
