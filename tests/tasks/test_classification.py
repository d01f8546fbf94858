"""The image classification task's MixUp / CutMix options (zoo/tasks/classification.py): training batches are
mixed and scored against mixed labels; validation and test see the images as they are, or with `eval_hflip` the
mean of each image's and its mirror's class probabilities."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from tests.helpers import compose_config
from zoo.tasks.classification import ImageClassificationTask, SequenceClassificationTask

NET = dict(image_size=8, in_channels=1, num_classes=10, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32)


def batch(size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(size, 1, 8, 8, generator=generator), torch.arange(size) % 10


def recorded_step(task: ImageClassificationTask, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the images the network saw, the loss's targets, the loss) of one step of `stage`."""
    seen = []
    task.net.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    targets = []
    original = F.cross_entropy

    def cross_entropy(logits, target, **kwargs):
        targets.append(target)
        return original(logits, target, **kwargs)

    inputs, labels = batch()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "cross_entropy", cross_entropy)
        loss = task._step((inputs, labels), stage)
    return seen[0], targets[0], loss


@pytest.mark.parametrize("option", ["mixup_alpha", "cutmix_alpha"])
def test_training_batches_are_mixed_and_scored_against_mixed_labels(option: str) -> None:
    torch.manual_seed(0)
    task = ImageClassificationTask(NET, **{option: 1.0})
    images, labels = batch()
    scored = []
    task.train_acc.update = lambda logits, labels: scored.append(labels)
    seen, targets, _ = recorded_step(task, "train")
    assert targets.shape == (8, 10) and torch.allclose(targets.sum(dim=1), torch.ones(8))
    assert torch.equal(scored[0], targets.argmax(dim=1))  # train/acc: each mixed image's larger share
    share = targets[torch.arange(8), labels]  # each image's own label's weight, the rest is its neighbour's
    assert (share < 1).all() and (share >= 0).all()
    neighbour = images.roll(1, dims=0)  # torchvision mixes each image with the one before it
    if option == "mixup_alpha":  # a convex combination with the share of the own label
        expected = share[:, None, None, None] * images + (1 - share[:, None, None, None]) * neighbour
        torch.testing.assert_close(seen, expected)
    else:  # pixels cut from the neighbour, in the proportion of the neighbour's label
        own = (seen == images).flatten(1).float().mean(dim=1)
        torch.testing.assert_close(own, share, atol=1 / 64, rtol=0)


@pytest.mark.parametrize("stage", ["val", "test"])
def test_evaluation_sees_the_images_as_they_are(stage: str) -> None:
    task = ImageClassificationTask(NET, mixup_alpha=1.0, cutmix_alpha=1.0)
    images, labels = batch()
    seen, targets, _ = recorded_step(task, stage)
    assert torch.equal(seen, images) and torch.equal(targets, labels)


def test_without_the_options_training_sees_plain_batches() -> None:
    task = ImageClassificationTask(NET)
    images, labels = batch()
    seen, targets, _ = recorded_step(task, "train")
    assert torch.equal(seen, images) and torch.equal(targets, labels)


def test_both_options_pick_one_mix_per_batch() -> None:
    torch.manual_seed(0)
    task = ImageClassificationTask(NET, mixup_alpha=1.0, cutmix_alpha=1.0)
    images, _ = batch()
    kinds = set()
    for _ in range(20):
        seen, _, _ = recorded_step(task, "train")
        kinds.add("cutmix" if (seen == images).any() else "mixup")  # CutMix keeps some pixels as they were
    assert kinds == {"mixup", "cutmix"}


@pytest.mark.parametrize("value", [-0.5, "much", True])
def test_a_bad_alpha_is_one_line_naming_it(value) -> None:
    with pytest.raises(ValueError, match=r"model.mixup_alpha must be a number >= 0, got"):
        ImageClassificationTask(NET, mixup_alpha=value)


def test_the_main_job_trains_on_mixup_batches_and_fashion_mnist_on_plain_ones(tmp_path) -> None:
    import hydra

    main = hydra.utils.instantiate(compose_config(["model=vit"], tmp_path).model, _convert_="all")
    assert isinstance(main.batch_mix, v2.MixUp) and main.batch_mix.alpha == 0.4
    fashion = compose_config(["experiment=vit_fashion_mnist"], tmp_path).model
    assert fashion.mixup_alpha == 0.0 and fashion.cutmix_alpha == 0.0
    assert fashion.net.stem == "conv" and compose_config(["model=vit"], tmp_path).model.net.stem == "patch"
    assert compose_config(["experiment=clip_fashion_mnist"], tmp_path).model.net.image.stem == "conv"


@pytest.mark.parametrize("stem", ["patch", "conv"])
def test_the_stem_a_config_names_is_the_models(stem: str, tmp_path) -> None:
    import hydra

    conv = stem == "conv"
    vit = compose_config(["model=vit", f"model.net.stem={stem}"], tmp_path).model
    vit = hydra.utils.instantiate(vit, _convert_="all")
    assert isinstance(vit.net.patch_embed, torch.nn.Sequential) is conv
    clip = compose_config(["model=clip", f"model.net.image.stem={stem}"], tmp_path).model
    clip = hydra.utils.instantiate(clip, _convert_="all")
    assert isinstance(clip.net.image_encoder.patch_embed, torch.nn.Sequential) is conv


@pytest.mark.parametrize("stage", ["val", "test"])
def test_eval_hflip_scores_the_mean_of_the_image_and_its_mirror(stage: str) -> None:
    torch.manual_seed(0)
    task = ImageClassificationTask(NET, eval_hflip=True).eval()
    with torch.no_grad():  # the head starts at zero (uniform scores, the same for any image): random weights
        for parameter in task.net.parameters():
            parameter.normal_(0, 0.5)
    images, labels = batch()
    scores = []
    original = F.cross_entropy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "cross_entropy", lambda logits, target, **_: scores.append(logits) or original(logits, target))
        loss = task._step((images, labels), stage)
    with torch.no_grad():
        probs = (task.net(images).softmax(-1) + task.net(images.flip(-1)).softmax(-1)) / 2
    torch.testing.assert_close(scores[0].exp(), probs)
    torch.testing.assert_close(loss, F.nll_loss(probs.log(), labels))
    plain = ImageClassificationTask(NET).eval()
    plain.load_state_dict(task.state_dict())
    _, _, plain_loss = recorded_step(plain, stage)  # off: the image alone, a different score
    assert not torch.allclose(plain_loss, loss)


def test_eval_hflip_leaves_training_batches_alone() -> None:
    task = ImageClassificationTask(NET, eval_hflip=True)
    images, labels = batch()
    seen, targets, _ = recorded_step(task, "train")
    assert torch.equal(seen, images) and torch.equal(targets, labels)


def test_eval_hflip_is_the_fashion_mnist_recipes_and_not_the_digits(tmp_path) -> None:
    import hydra

    assert hydra.utils.instantiate(compose_config(["model=vit"], tmp_path).model, _convert_="all").eval_hflip is False
    fashion = compose_config(["experiment=vit_fashion_mnist"], tmp_path).model
    assert hydra.utils.instantiate(fashion, _convert_="all").eval_hflip is True


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_bad_eval_hflip_is_one_line_naming_it(value) -> None:
    with pytest.raises(ValueError, match=r"model.eval_hflip mirrors images: true or false.*got"):
        ImageClassificationTask(NET, eval_hflip=value)


def test_token_sequences_refuse_mixing() -> None:
    net = dict(vocab_size=16, num_classes=10, max_length=8, dim=16, depth=1, num_heads=2, mlp_dim=32)
    SequenceClassificationTask(net)
    with pytest.raises(ValueError, match=r"mix images; SequenceClassificationTask's inputs are token ids"):
        SequenceClassificationTask(net, mixup_alpha=0.2)
    with pytest.raises(ValueError, match=r"model.eval_hflip .* false for SequenceClassificationTask's token ids"):
        SequenceClassificationTask(net, eval_hflip=True)
