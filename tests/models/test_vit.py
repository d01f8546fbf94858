"""ViT: shapes for both poolings, RoPE, drop path, and exact parity with torchvision's ViT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from zoo.models.vit import ViT, ViTConfig, resample_position_embedding, vit_from_pretrained


def tiny(**overrides) -> ViT:
    return ViT(ViTConfig(**{"image_size": 8, "patch_size": 2, "dim": 32, "depth": 2, "num_heads": 4, **overrides}))


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_output_shapes_for_both_poolings(pool: str) -> None:
    model = tiny(pool=pool, num_classes=7)
    images = torch.randn(5, 1, 8, 8)
    features = model.forward_features(images)
    tokens = 16 + (1 if pool == "cls" else 0)
    assert features.shape == (5, tokens, 32)
    assert model(images).shape == (5, 7)
    assert tiny(pool=pool, num_classes=0)(images).shape == (5, 32)


def test_vit_with_rope_has_no_position_table_and_uses_2d_positions() -> None:
    torch.manual_seed(0)
    model = tiny(attention={"variant": "full", "rope": True}, num_classes=0).eval()
    assert model.pos_embed is None
    positions = model.blocks[0].self_attn.positions  # the class token at (0, 0), patches at (row + 1, col + 1)
    assert (
        positions.shape == (17, 2) and positions[0].tolist() == [0, 0] and positions[1:3].tolist() == [[1, 1], [1, 2]]
    )
    images = torch.randn(2, 1, 8, 8)
    before = model(images)
    # Scrambling which patch sits where changes the output: the positions really reach attention.
    order = torch.randperm(17)
    for block in model.blocks:
        block.self_attn.positions = block.self_attn.positions[order]
    assert (model(images) - before).abs().max() > 1e-3


def test_vit_rejects_image_size_not_divisible_by_patch() -> None:
    with pytest.raises(ValueError, match="image_size=30 and patch_size=4"):
        ViTConfig(image_size=30, patch_size=4)


def test_vit_rejects_unknown_pooling() -> None:
    with pytest.raises(ValueError, match="valid choices"):
        ViTConfig(pool="max")


@pytest.mark.parametrize("patch_size", [2, 4])
def test_conv_stem_halves_the_image_per_stride_two_layer_and_keeps_the_token_grid(patch_size: int) -> None:
    torch.manual_seed(0)
    model = ViT(
        ViTConfig(image_size=16, patch_size=patch_size, dim=32, depth=1, num_heads=4, stem="conv", num_classes=3)
    )
    convs = [m for m in model.patch_embed if isinstance(m, torch.nn.Conv2d)]
    # Xiao et al.: 3x3 stride-2 convolutions with channels doubling up to the width, then a 1x1 to the width.
    assert [(c.kernel_size, c.stride, c.out_channels) for c in convs] == [
        ((3, 3), (2, 2), 32 >> (len(convs) - 2 - i)) for i in range(len(convs) - 1)
    ] + [((1, 1), (1, 1), 32)]
    assert len(convs) - 1 == {2: 1, 4: 2}[patch_size]
    grid = 16 // patch_size
    assert model.forward_features(torch.randn(2, 1, 16, 16)).shape == (2, 1 + grid * grid, 32)
    # Not the patch stem: its weights are another network's.
    assert "patch_embed.weight" not in model.state_dict() and "patch_embed.1.running_mean" in model.state_dict()


def test_conv_stem_batchnorm_learns_statistics_in_training_and_uses_them_in_eval() -> None:
    torch.manual_seed(0)
    model = tiny(stem="conv", num_classes=0)  # pooled features (a classifier head starts at zero)
    images = torch.randn(6, 1, 8, 8) * 3 + 2
    norm = model.patch_embed[1]
    model.train()
    first = model(images[:3])
    assert norm.running_mean.abs().sum() > 0  # training batches update the running statistics
    torch.testing.assert_close(model(images[:3]), first, rtol=0, atol=0)  # batch statistics: same batch, same out
    model.eval()
    with torch.no_grad():
        alone = model(images[:1])
        batched = model(images[:3])
    # Eval normalises with the stored statistics: an image's output does not depend on its batch.
    torch.testing.assert_close(alone, batched[:1])
    model.train()
    # Training normalises by the batch: the same image in another batch gives another output.
    assert (model(images[:3])[0] - model(images[[0, 4, 5]])[0]).abs().max() > 1e-4


def test_conv_stem_needs_a_power_of_two_patch_and_unknown_stems_name_the_choices() -> None:
    with pytest.raises(ValueError, match=r"patch_size must be a power of 2 >= 2, got patch_size=6"):
        ViTConfig(image_size=12, patch_size=6, stem="conv")
    with pytest.raises(ValueError, match=r"unknown ViT stem 'cnn'; valid choices: \['patch', 'conv'\]"):
        ViTConfig(stem="cnn")


def test_torchvision_weights_give_the_patch_stem_whatever_the_config_asked(tmp_path: Path) -> None:
    path = tmp_path / "vit.pth"
    torch.save(torchvision_vit().state_dict(), path)
    config = ViTConfig(image_size=16, in_channels=3, num_classes=10, stem="conv")
    model, notes = vit_from_pretrained(str(path), config)
    assert model.config.stem == "patch" and isinstance(model.patch_embed, torch.nn.Conv2d)
    assert any("'stem': 'patch'" in note for note in notes)


def test_drop_path_is_identity_in_eval_and_random_in_training() -> None:
    torch.manual_seed(0)
    model = tiny(drop_path=0.5)
    images = torch.randn(8, 1, 8, 8)
    model.eval()
    assert torch.equal(model(images), model(images))
    model.train()
    assert not torch.allclose(model.forward_features(images), model.forward_features(images))


def torchvision_vit(image_size: int = 32, num_classes: int = 7) -> torchvision.models.VisionTransformer:
    torch.manual_seed(0)
    reference = torchvision.models.VisionTransformer(
        image_size=image_size,
        patch_size=8,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        mlp_dim=128,
        num_classes=num_classes,
    )
    torch.nn.init.normal_(reference.heads.head.weight, std=0.5)  # torchvision starts it at zero
    torch.nn.init.normal_(reference.encoder.pos_embedding, std=0.5)
    return reference.eval()


def test_from_torchvision_matches_logits() -> None:
    reference = torchvision_vit()
    model = ViT.from_torchvision(reference).eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = reference(images)
        assert expected.abs().max() > 1.0  # a real signal, not zeros
        torch.testing.assert_close(model(images), expected, atol=1e-4, rtol=0)


def test_from_torchvision_at_another_image_size_resamples_positions() -> None:
    reference = torchvision_vit()
    model = ViT.from_torchvision(reference, image_size=48, num_classes=3)
    assert model.pos_embed.shape == (1, 1 + 36, 64)
    # The class token's position is kept as is.
    torch.testing.assert_close(model.pos_embed[:, 0], reference.encoder.pos_embedding[:, 0])
    assert model(torch.randn(2, 3, 48, 48)).shape == (2, 3)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_axial_attention_follows_the_patch_grid(pool: str) -> None:
    torch.manual_seed(0)
    model = tiny(attention={"variant": "axial", "rope": True}, pool=pool, num_classes=3).eval()
    attention = model.blocks[0].self_attn
    prefix = 1 if pool == "cls" else 0
    assert (attention.kernel.width, attention.kernel.prefix) == (4, prefix)  # the 4 x 4 patch grid
    tokens = torch.randn(2, 16 + prefix, 32)
    _, weights = attention(tokens, need_weights=True)
    patches = weights[0, 0, prefix:, prefix:] > 0  # patch (r, c) sees row r and column c
    rows, cols = torch.arange(16) // 4, torch.arange(16) % 4
    assert torch.equal(patches, (rows[:, None] == rows) | (cols[:, None] == cols))
    assert bool((weights[0, 0, :, :prefix] > 0).all()) and bool((weights[0, 0, :prefix] > 0).all())
    images = torch.randn(2, 1, 8, 8, requires_grad=True)
    model.forward_features(images).sum().backward()
    assert images.grad.abs().sum() > 0


def test_resample_position_embedding_is_identity_at_same_grid_and_smooth_otherwise() -> None:
    table = torch.randn(1, 1 + 16, 8)
    assert resample_position_embedding(table, 4) is table
    constant = torch.ones(1, 1 + 16, 8)
    torch.testing.assert_close(resample_position_embedding(constant, 7), torch.ones(1, 1 + 49, 8))


def test_pretrained_file_fine_tunes_at_new_size_and_keeps_attention_choice(tmp_path: Path) -> None:
    reference = torchvision_vit()
    path = tmp_path / "vit.pth"
    torch.save(reference.state_dict(), path)
    config = ViTConfig(image_size=16, in_channels=3, num_classes=10, attention={"variant": "full", "rope": True})
    model, notes = vit_from_pretrained(str(path), config)
    assert model.config.dim == 64 and model.config.depth == 2 and model.config.patch_size == 8
    assert model.pos_embed is None and any("RoPE" in note for note in notes)
    assert any("head" in note for note in notes)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, reference.encoder.layers[1].mlp[3].weight)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_pretrained_mismatch_names_missing_and_unexpected_keys(tmp_path: Path) -> None:
    state_dict = tiny().state_dict()
    state_dict["blocks.5.extra.weight"] = torch.zeros(1)
    del state_dict["norm.weight"]
    path = tmp_path / "broken.pt"
    torch.save(state_dict, path)
    with pytest.raises(
        ValueError, match=r"missing keys \['norm.weight'\], unexpected keys \['blocks.5.extra.weight'\]"
    ):
        vit_from_pretrained(str(path), ViTConfig(image_size=8, patch_size=2, dim=32, depth=2, num_heads=4))


@pytest.mark.parametrize("attention", ["full", "local", "linear", "rope"])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_attention_weights_exist_for_every_variant_and_their_rollout_rows_sum_to_one(attention, pool) -> None:
    from tests.helpers import VARIANTS
    from zoo.models.vit import attention_rollout

    model = tiny(attention=VARIANTS[attention], pool=pool).eval()
    images = torch.randn(3, 1, 8, 8)
    weights = model.attention_weights(images)
    tokens = 16 + (pool == "cls")
    assert len(weights) == 2 and all(w.shape == (3, 4, tokens, tokens) for w in weights)
    for w in weights:
        torch.testing.assert_close(w.sum(dim=-1), torch.ones(3, 4, tokens))
    if attention == "local":  # window 4: a patch attends to the two tokens on either side, no farther
        assert (weights[0][:, :, 8, 11:] == 0).all() and (weights[0][:, :, 8, 6:11] > 0).all()
    rollout = attention_rollout(weights)
    assert rollout.shape == (3, tokens, tokens)
    torch.testing.assert_close(rollout.sum(dim=-1), torch.ones(3, tokens))
    torch.testing.assert_close(model(images), model.forward_head(model.forward_features(images)))


def test_attention_rollout_is_the_product_of_residual_averaged_layers() -> None:
    """Abnar & Zuidema 2020, eq. 1: rollout = A_L ... A_1 with A_l = 0.5 mean_heads(W_l) + 0.5 I."""
    from zoo.models.vit import attention_rollout

    torch.manual_seed(0)
    weights = [torch.rand(2, 3, 5, 5).softmax(dim=-1) for _ in range(3)]
    averaged = [0.5 * w.mean(dim=1) + 0.5 * torch.eye(5) for w in weights]
    torch.testing.assert_close(attention_rollout(weights), averaged[2] @ averaged[1] @ averaged[0])
    torch.testing.assert_close(attention_rollout(weights[:1], residual=False), weights[0].mean(dim=1))
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])
