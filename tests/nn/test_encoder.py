"""The encoder trunk: pooling over tokens (padding left out), stochastic depth rising over the blocks, and the
parameter names the families keep (no prefix: checkpoints and weight imports unchanged)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zoo.attention import AttentionConfig, TokenLayout
from zoo.models.clip import TextTransformer
from zoo.models.vit import ViT
from zoo.nn import EncoderTrunk, pool_tokens


def test_mean_pooling_leaves_padding_out_and_cls_takes_the_first_token() -> None:
    features = torch.randn(2, 5, 3)
    mask = torch.tensor([[False, False, True, True, True], [False] * 5])
    pooled = pool_tokens(features, "mean", mask)
    torch.testing.assert_close(pooled[0], features[0, :2].mean(dim=0))
    torch.testing.assert_close(pooled[1], features[1].mean(dim=0))
    torch.testing.assert_close(pool_tokens(features, "mean"), features.mean(dim=1))
    assert torch.equal(pool_tokens(features, "cls", mask), features[:, 0])
    with pytest.raises(ValueError, match="valid choices"):
        pool_tokens(features, "max")


def test_build_trunk_reads_the_shared_config_fields_and_ramps_drop_path() -> None:
    shared = {"dim": 8, "depth": 3, "num_heads": 2, "mlp_dim": 16, "attention": AttentionConfig(variant="local"),
              "dropout": 0.0, "activation": "relu", "bias": True, "norm_eps": 1e-6}  # fmt: skip
    trunk = EncoderTrunk()
    trunk.build_trunk(SimpleNamespace(**shared, drop_path=0.2, num_classes=3), TokenLayout(max_length=4), causal=True)
    assert [block.drop_path.p for block in trunk.blocks] == pytest.approx([0.0, 0.1, 0.2])
    assert trunk.blocks[0].self_attn.causal and trunk.blocks[0].self_attn.variant == "local"
    assert trunk.blocks[0].mlp.fc1.out_features == 16 and trunk.norm.eps == 1e-6
    assert trunk.head.out_features == 3 and trunk.norm.bias is not None
    headless = EncoderTrunk()  # a family without drop_path and num_classes (CLIP's text tower)
    headless.build_trunk(SimpleNamespace(**shared), TokenLayout(), norm_bias=False)
    assert isinstance(headless.head, torch.nn.Identity) and headless.norm.bias is None
    assert [block.drop_path.p for block in headless.blocks] == [0.0, 0.0, 0.0]


def test_the_families_keep_their_parameter_names() -> None:
    vit = {name.split(".")[0] for name in ViT(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2).state_dict()}
    assert vit == {"cls_token", "pos_embed", "patch_embed", "blocks", "norm", "head"}
    text = {name.split(".")[0] for name in TextTransformer(dim=16, depth=1, num_heads=2).state_dict()}
    assert text == {"token_embedding", "pos_embed", "blocks", "norm"}
