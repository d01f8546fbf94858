"""Every model family builds and trains with every attention variant of conf/attention/ (at its defaults) that
its definition allows, and refuses the others (bidirectional-only kernels in causal models) with one line
naming the valid choices: what `python run.py model=M attention=V` does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo.app.overrides import group_option
from zoo.attention import VARIANTS, AttentionConfig
from zoo.attention.registry import causal_variants
from zoo.models.clip import CLIP, CLIPConfig
from zoo.models.gpt import GPT, GPTConfig
from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
from zoo.models.translation import TranslationConfig, TranslationTransformer
from zoo.models.vit import ViT, ViTConfig

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention"
ATTENTIONS = sorted(p.stem for p in CONF.glob("*.yaml"))
IMAGE = {"image_size": 8, "patch_size": 2, "in_channels": 1, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}


def attention(name: str) -> AttentionConfig:
    return AttentionConfig(**group_option("attention", name))


def step_vit(config: AttentionConfig) -> torch.Tensor:
    return ViT(ViTConfig(**IMAGE, num_classes=3, attention=config))(torch.randn(2, 1, 8, 8)).sum()


def step_gpt(config: AttentionConfig) -> torch.Tensor:
    model = GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=1, n_head=2, n_embd=16, attention=config))
    return model(torch.randint(0, 20, (2, 12))).sum()


def step_translation(config: AttentionConfig) -> torch.Tensor:
    model = TranslationTransformer(
        TranslationConfig(vocab_size=20, dim=16, encoder_layers=1, decoder_layers=1, num_heads=2, mlp_dim=32,
                          max_length=16, attention=config)
    )  # fmt: skip
    return model(torch.randint(3, 20, (2, 9)), torch.randint(3, 20, (2, 7))).sum()


def step_clip(config: AttentionConfig) -> torch.Tensor:
    text = {"vocab_size": 20, "max_length": 10, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}
    model = CLIP(CLIPConfig(embed_dim=8, image={**IMAGE}, text=text, attention=config))
    tokens = torch.tensor([[1, 5, 6, 2, 0, 0], [1, 7, 8, 9, 10, 2]])
    image_embeddings, text_embeddings, scale = model(torch.randn(2, 1, 8, 8), tokens)
    return (image_embeddings @ text_embeddings.T * scale).sum()


def step_sequence_classifier(config: AttentionConfig) -> torch.Tensor:
    settings = {"vocab_size": 16, "max_length": 12, "num_classes": 3, "dim": 16, "depth": 1, "num_heads": 2}
    model = SequenceClassifier(SequenceClassifierConfig(**settings, attention=config))
    return model(torch.randint(1, 16, (2, 12))).sum()


STEPS = {
    "vit": step_vit, "gpt": step_gpt, "translation": step_translation, "clip": step_clip,
    "sequence_classifier": step_sequence_classifier,
}  # fmt: skip
CAUSAL = {"vit": False, "gpt": True, "translation": True, "clip": True, "sequence_classifier": False}
GRID = {"vit", "clip"}  # models with a patch grid (CLIP's image tower): 2-D positions


@pytest.mark.parametrize("name", ATTENTIONS)
@pytest.mark.parametrize("model", sorted(STEPS))
def test_every_model_trains_with_every_attention_it_allows(model: str, name: str) -> None:
    config = attention(name)
    torch.manual_seed(0)
    if CAUSAL[model] and not VARIANTS[config.variant].supports_causal:
        with pytest.raises(ValueError) as info:
            STEPS[model](config)
        message = str(info.value)
        assert "\n" not in message and f"{config.variant!r} is bidirectional only" in message
        assert f"valid choices: {causal_variants()}" in message
        return
    loss = STEPS[model](config)
    loss.backward()
    assert torch.isfinite(loss)


def test_clip_takes_compressed_attention_in_its_image_tower() -> None:
    torch.manual_seed(0)
    image = {**IMAGE, "attention": {"variant": "compressed", "compressed_length": 8}}
    text = {"vocab_size": 20, "max_length": 10, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}
    model = CLIP(CLIPConfig(embed_dim=8, image=image, text=text))
    assert model.image_encoder.blocks[0].self_attn.variant == "compressed"
    assert model.text_encoder.blocks[0].self_attn.variant == "full"
    image_embeddings, _, _ = model(torch.randn(2, 1, 8, 8), torch.tensor([[1, 5, 2]]))
    assert image_embeddings.shape == (2, 8)


# The shared fields of AttentionConfig (part 2 of the attention menu) on top of every conf/attention yaml, and
# linear attention's other feature maps.
OPTIONS = {
    "alibi": {"position_bias": "alibi"},
    "t5": {"position_bias": "t5", "num_buckets": 8, "max_distance": 16},
    "mqa": {"kv_heads": 1},
    "rope_ntk": {"rope": True, "rope_scaling": "ntk", "rope_factor": 2.0},
    "rope_dynamic": {"rope": True, "rope_scaling": "dynamic", "rope_factor": 2.0},
}
CASES = [(model, name, option) for model in sorted(STEPS) for name in ATTENTIONS for option in OPTIONS]
CASES += [(model, "linear", option) for model in sorted(STEPS) for option in ("relu", "favor")]
OPTIONS |= {"relu": {"feature_map": "relu"}, "favor": {"feature_map": "favor", "num_features": 8}}


def refusal(model: str, variant: str, option: str) -> str | None:
    """What the one-line error of a combination the definitions do not allow says (None: it trains)."""
    if option in ("alibi", "t5") and variant in ("linear", "compressed"):
        return "never forms"  # no scores to add a bias to
    if model in GRID and option in ("alibi", "t5"):
        return "a patch grid (ViT) takes attention.rope=true"  # distances along a sequence, not a grid
    if model in GRID and option.startswith("rope_"):
        return "stretches 1-D sequences"  # length scaling of 1-D RoPE; ViT's is 2-D
    if CAUSAL[model] and variant == "compressed":
        return "is bidirectional only"
    return None


@pytest.mark.parametrize(("model", "name", "option"), CASES)
def test_every_model_trains_with_every_attention_option_or_refuses_in_one_line(model, name, option) -> None:
    torch.manual_seed(0)
    expected = refusal(model, attention(name).variant, option)
    if expected is not None:
        with pytest.raises(ValueError) as info:  # from the config, or from the model that builds on it
            STEPS[model](attention(name).replace(**OPTIONS[option]))
        assert "\n" not in str(info.value) and expected in str(info.value), info.value
        return
    loss = STEPS[model](attention(name).replace(**OPTIONS[option]))
    loss.backward()
    assert torch.isfinite(loss)


def test_translation_takes_compressed_attention_in_its_encoder() -> None:
    from zoo.models.seq2seq import greedy_decode

    torch.manual_seed(0)
    settings = {"vocab_size": 20, "dim": 16, "encoder_layers": 1, "decoder_layers": 1, "num_heads": 2, "mlp_dim": 32}
    config = TranslationConfig(**settings, max_length=16, encoder_attention={"variant": "compressed", "kv_heads": 1})
    model = TranslationTransformer(config)
    encoder, decoder = model.encoder[0].self_attn, model.decoder[0].self_attn
    assert (encoder.variant, encoder.kv_heads, decoder.variant, decoder.kv_heads) == ("compressed", 1, "full", 2)
    assert model.decoder[0].cross_attn.variant == "full"
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])  # padded source: compressed masks it
    model(src, torch.randint(3, 20, (2, 7))).sum().backward()
    assert encoder.kernel.key_projection.grad is not None
    assert len(greedy_decode(model.eval(), src, max_len_a=1.0, max_len_b=2)) == 2
    assert TranslationConfig.from_dict(config.to_dict()).encoder_attention == {"variant": "compressed", "kv_heads": 1}
    for name in ("rope", "position_bias"):  # positions are both stacks' (positions / attention)
        with pytest.raises(ValueError, match=f"encoder_attention.{name} is set.*set it there"):
            TranslationConfig(**settings, encoder_attention={name: "alibi" if name == "position_bias" else True})
    with pytest.raises(ValueError, match="unknown attention variant 'bigbird'"):
        TranslationConfig(**settings, encoder_attention={"variant": "bigbird"})
