"""The checkpoint maps (zoo/models/convert/) lose nothing: a zoo GPT of every shape Hugging Face has comes back from
transformers tensor for tensor; every tensor of a transformers CLIPModel and of a torchvision VisionTransformer has
exactly one zoo counterpart, holding the same numbers."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_clip import huggingface_clip
from zoo.models.clip import CLIP
from zoo.models.convert import huggingface
from zoo.models.convert.torchvision import vit_state_from_torchvision
from zoo.models.gpt import GPT, GPTConfig
from zoo.models.vit import ViT

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SIZES = {"vocab_size": 37, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32}
# activation: unused by gated MLPs (their gate picks it); the import writes silu, as the llama preset does.
LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "activation": "silu", "bias": False, "attention": {"rope": True}}
# Each GPT shape and the transformers class it exports as.
SHAPES = {
    "gpt2": ({"activation": "gelu_tanh"}, "GPT2LMHeadModel"),
    "gpt2_untied": ({"tie_weights": False, "mlp_dim": 48}, "GPT2LMHeadModel"),
    "llama": ({**LLAMA, "tie_weights": False, "attention": {"rope": True, "kv_heads": 2}}, "LlamaForCausalLM"),
    "llama_tied_biases_geglu": ({**LLAMA, "mlp": "geglu", "bias": True}, "LlamaForCausalLM"),
    "qwen2": ({**LLAMA, "qkv_bias": True, "attention": {"rope": True, "kv_heads": 1}}, "Qwen2ForCausalLM"),
    "mistral": ({**LLAMA, "attention": {"rope": True, "variant": "local", "window": 8}}, "MistralForCausalLM"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_gpt_to_huggingface_and_back_is_the_identity(shape: str) -> None:
    overrides, architecture = SHAPES[shape]
    torch.manual_seed(0)
    ours = GPT(GPTConfig(**{**SIZES, **overrides}))
    with torch.no_grad():  # norms and biases start at 1 and 0: make every tensor tell
        for parameter in ours.parameters():
            parameter.normal_()
    exported = ours.to_huggingface()
    assert type(exported).__name__ == architecture
    back = GPT.from_huggingface(exported)
    assert back.config.to_dict() == {**ours.config.to_dict(), "mlp_dim": back.config.mlp_dim}
    mine, theirs = ours.state_dict(), back.state_dict()
    assert list(theirs) == list(mine)
    assert all(torch.equal(theirs[name], tensor) for name, tensor in mine.items())


def test_every_clip_tensor_of_transformers_has_one_zoo_counterpart() -> None:
    reference = huggingface_clip()
    theirs = {name: tensor for name, tensor in reference.state_dict().items() if not name.endswith("position_ids")}
    ours = CLIP.from_huggingface(reference).state_dict()
    sources = {name: huggingface.clip_sources(name) for name in ours}
    used = [source for names in sources.values() for source in names]
    assert sorted(used) == sorted(theirs)  # one to one
    for name, names in sources.items():
        expected = torch.cat([theirs[source] for source in names]) if len(names) > 1 else theirs[names[0]]
        assert torch.equal(ours[name].flatten(), expected.flatten()), name


def test_every_torchvision_vit_tensor_has_one_zoo_counterpart() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = torchvision.models.VisionTransformer(
        image_size=16, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5
    )
    theirs = reference.state_dict()
    renamed = vit_state_from_torchvision(theirs)
    assert len(renamed) == len(theirs)  # no two torchvision tensors share a zoo name
    ours = ViT.from_torchvision(reference).state_dict()
    assert sorted(renamed) == sorted(ours)
    assert all(torch.equal(ours[name], tensor) for name, tensor in renamed.items())
