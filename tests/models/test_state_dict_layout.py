"""Checkpoints of the previous layout still load: every family's parameter names and shapes, at tiny configs that
exercise its options (tied and untied heads, gated MLPs, grouped heads, a shared T5 bias, the conv stem, pre- and
post-norm stacks with cross-attention), equal those pinned in state_dict_layout.json, written from the models of
commit 58914fa (before the checkpoint maps and the block config moved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.export import FAMILIES

LAYOUT = json.loads((Path(__file__).parent / "state_dict_layout.json").read_text())
CASES = {
    "gpt": ("gpt", {"vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16}),
    "gpt_llama_shaped": ("gpt", {"vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 16,
                                 "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "qkv_bias": True,
                                 "qk_norm": True, "tie_weights": False,
                                 "attention": {"rope": True, "kv_heads": 2}}),
    "gpt_t5_bias": ("gpt", {"vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
                            "attention": {"position_bias": "t5"}}),
    "vit": ("vit", {"image_size": 8, "patch_size": 4, "in_channels": 3, "num_classes": 3, "dim": 16, "depth": 2,
                    "num_heads": 2}),
    "vit_conv_stem_mean_pool": ("vit", {"image_size": 8, "patch_size": 4, "num_classes": 3, "dim": 16, "depth": 2,
                                        "num_heads": 2, "stem": "conv", "pool": "mean"}),
    "clip": ("clip", {"embed_dim": 8,
                      "image": {"image_size": 8, "patch_size": 4, "dim": 16, "depth": 2, "num_heads": 2},
                      "text": {"vocab_size": 32, "max_length": 8, "dim": 16, "depth": 2, "num_heads": 2}}),
    "translation_post_norm": ("translation", {"vocab_size": 32, "dim": 16, "encoder_layers": 2, "decoder_layers": 2,
                                              "num_heads": 2, "mlp_dim": 32, "max_length": 16,
                                              "positions": "learned", "tie_embeddings": False}),
    "translation_pre_norm": ("translation", {"vocab_size": 32, "dim": 16, "encoder_layers": 1, "decoder_layers": 1,
                                             "num_heads": 2, "mlp_dim": 32, "max_length": 16, "norm_first": True}),
    "sequence_classifier": ("sequence_classifier", {"vocab_size": 32, "max_length": 16, "num_classes": 3, "dim": 16,
                                                    "depth": 2, "num_heads": 2}),
}  # fmt: skip


def build(case: str) -> torch.nn.Module:
    family, fields = CASES[case]
    model_class, config_class = FAMILIES[family]
    return model_class(config_class.from_dict(fields))


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_names_and_shapes_are_the_previous_layouts(case: str) -> None:
    layout = {name: list(tensor.shape) for name, tensor in build(case).state_dict().items()}
    assert layout == LAYOUT[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_state_dict_of_the_previous_layout_loads_strictly(case: str) -> None:
    model = build(case)
    torch.manual_seed(0)
    own, old, by_storage = model.state_dict(), {}, {}
    for name, shape in LAYOUT[case].items():  # a tied weight (GPT's head) is one tensor under two names
        tensor = own[name]
        key = tensor.data_ptr()
        if tensor.is_floating_point():  # BatchNorm's num_batches_tracked stays as it is
            by_storage.setdefault(key, torch.randn(shape))
        old[name] = by_storage.get(key, tensor.clone())
    model.load_state_dict(old, strict=True)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in old.items())
