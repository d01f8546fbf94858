"""Activation checkpointing (model.net.checkpointing=true, torch.utils.checkpoint per block) gives the gradients
of the plain run in every family, and only in training: evaluation and cached decoding run the block as is."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model
from zoo.nn.blocks import TransformerBlock, set_checkpointing


def family_inputs(family: str) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    tokens = lambda high, length: torch.randint(1, high, (2, length), generator=generator)  # noqa: E731
    images = torch.randn(2, 1, 8, 8, generator=generator, dtype=torch.float64)
    return {
        "vit": (images,),
        "gpt": (tokens(10, 12),),
        "translation": (tokens(10, 9), tokens(10, 7)),
        "clip": (images, tokens(10, 12)),
        "sequence_classifier": (tokens(16, 15),),
        "bert": (tokens(20, 16),),
    }[family]


def gradients(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    model.zero_grad()
    out = model(*inputs)
    outputs = out if isinstance(out, tuple) else (out,)
    sum(o.float().square().mean() for o in outputs if torch.is_tensor(o) and o.is_floating_point()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["vit", "gpt", "translation", "clip", "sequence_classifier", "bert"])
def test_checkpointed_gradients_equal_the_plain_run(family: str) -> None:
    model = tiny_model(family).double().train()
    inputs = family_inputs(family)
    plain = gradients(model, inputs)
    calls = []
    for block in model.modules():
        if isinstance(block, TransformerBlock):
            block.mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    set_checkpointing(model, True)
    checkpointed = gradients(model, inputs)
    assert plain.keys() == checkpointed.keys() and plain
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], msg=name)
    blocks = sum(isinstance(m, TransformerBlock) for m in model.modules())
    assert len(calls) == 2 * blocks  # each block ran once more in the backward: it was recomputed


def test_checkpointing_is_a_config_field_of_every_family() -> None:
    from zoo.models.bert import BERT, BERTConfig
    from zoo.models.clip import CLIP, CLIPConfig
    from zoo.models.gpt import GPT, GPTConfig
    from zoo.models.sequence_classifier import SequenceClassifier, SequenceClassifierConfig
    from zoo.models.translation import TranslationConfig, TranslationTransformer
    from zoo.models.vit import ViT, ViTConfig

    models = [
        GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, checkpointing=True)),
        ViT(ViTConfig(image_size=8, patch_size=4, dim=8, depth=1, num_heads=2, checkpointing=True)),
        TranslationTransformer(TranslationConfig(vocab_size=11, dim=8, encoder_layers=1, decoder_layers=1,
                                                 num_heads=2, mlp_dim=16, checkpointing=True)),
        CLIP(CLIPConfig(embed_dim=8, image={"image_size": 8, "patch_size": 4, "dim": 8, "depth": 1, "num_heads": 2},
                        text={"dim": 8, "depth": 1, "num_heads": 2}, checkpointing=True)),
        SequenceClassifier(SequenceClassifierConfig(vocab_size=11, max_length=8, num_classes=2, dim=8, depth=1,
                                                    num_heads=2, checkpointing=True)),
        BERT(BERTConfig(vocab_size=11, max_length=8, dim=8, depth=1, num_heads=2, checkpointing=True)),
    ]  # fmt: skip
    for model in models:
        blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
        assert blocks and all(block.checkpointing for block in blocks), type(model).__name__


def test_evaluation_and_cached_decoding_skip_checkpointing() -> None:
    model = set_checkpointing(tiny_model("gpt"), True)
    idx = torch.randint(1, 10, (1, 6))
    caches = model.new_caches()
    steps = torch.cat([model(idx[:, :3], caches), model(idx[:, 3:], caches)], dim=1)
    torch.testing.assert_close(steps, model(idx), atol=1e-5, rtol=1e-4)
