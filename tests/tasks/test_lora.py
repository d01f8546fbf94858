"""LoRA from the command line in every family (conf/model/*.yaml): `model.lora.rank=r` builds the task's network
with adapters, only they (and lora.modules_to_save) are optimised, the base stays untouched, merging gives the
adapted function; a two-step run writes a checkpoint that zoo.load rebuilds, merged. With a pretrained base the
checkpoint holds what trained only and names the base. A family without Transformer blocks refuses in one line."""

from __future__ import annotations

import re
from pathlib import Path

import hydra
import pytest
import torch

import zoo
from tests.helpers import CONF, compose_config, run_in_process
from tests.nn.test_checkpointing import family_inputs
from zoo.nn.lora import merge_lora
from zoo.tasks.optim import build_optimizer

FAMILIES = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))  # every model= option
# A short run of each family, small (embedded or generated data). A new family fails until it is added here.
TINY = {
    "vit": ["model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32"],
    "gpt": ["model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "data.block_size=16",
            "data.batch_size=4", "data.eval_batches=1", "model.sample.max_new_tokens=0",
            "trainer.val_check_interval=1"],
    "llama": ["model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16", "model.net.mlp_dim=24",
              "data.block_size=16", "data.batch_size=4", "data.eval_batches=1", "model.sample.max_new_tokens=0",
              "trainer.val_check_interval=1"],
    "translation": ["model.net.dim=16", "model.net.num_heads=2", "model.net.mlp_dim=32", "model.net.encoder_layers=1",
                    "model.net.decoder_layers=1", "data.num_train=16", "data.num_val=4", "data.num_test=4",
                    "model.num_samples=0"],
    "rnn_translation": ["model.net.embed_dim=16", "model.net.hidden=16", "data.num_train=16", "data.num_val=4"],
    "clip": ["model.net.image.dim=16", "model.net.image.depth=1", "model.net.image.num_heads=2",
             "model.net.image.mlp_dim=32", "model.net.text.dim=16", "model.net.text.depth=1",
             "model.net.text.num_heads=2", "model.net.text.mlp_dim=32", "model.net.embed_dim=16"],
    "sequence_classifier": ["model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32"],
    "bert": ["model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "model.net.mlp_dim=32",
             "data.block_size=16", "data.batch_size=4", "data.eval_batches=1", "trainer.val_check_interval=1"],
}  # fmt: skip
# Two steps: a head that starts at zero (the classifiers') passes no gradient to the adapters in the first.
STEPS = ["trainer.max_steps=2", "trainer.max_epochs=1", "+trainer.limit_train_batches=2",
         "trainer.limit_val_batches=1", "test=false", "print_config=false", "logger=csv",
         "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]  # fmt: skip
# The projections LoRA adapts (zoo/nn/lora.py): blocks' self-attention and MLP, never cross-attention.
ADAPTED = re.compile(r"(.*\.)?(self_attn\.(in_proj|out_proj)|mlp\.(gate|fc1|fc2))")
LORA_FAMILIES = [family for family in FAMILIES if family != "rnn_translation"]


def test_every_family_has_a_short_run_here() -> None:
    assert set(TINY) == set(FAMILIES)


def build_task(family: str, *overrides: str) -> torch.nn.Module:
    """The task `python run.py model=<family> <overrides>` builds (a GPT's vocabulary given, so its net exists)."""
    vocab = ["model.net.vocab_size=40"] if family in ("gpt", "llama", "bert") else []
    vocab += ["model.net.max_length=18"] if family == "bert" else []
    cfg = compose_config([f"model={family}", *TINY[family], *vocab, *overrides])
    torch.manual_seed(0)
    return hydra.utils.instantiate(cfg.model, _convert_="all")


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_only_adapters_and_saved_modules_train_and_their_count_is_rank_times_in_plus_out(family) -> None:
    plain, task = build_task(family), build_task(family, "model.lora.rank=4")
    saved = task.lora.modules_to_save
    expected = sum(4 * (m.in_features + m.out_features) for n, m in plain.net.named_modules() if ADAPTED.fullmatch(n))
    expected += sum(p.numel() for name in saved for p in plain.net.get_submodule(name).parameters())
    trainable = {name: p.numel() for name, p in task.net.named_parameters() if p.requires_grad}
    assert expected and sum(trainable.values()) == expected
    assert all("lora_" in name or name.split(".")[0] in saved for name in trainable)
    optimised = {id(p) for group in build_optimizer(task.net).param_groups for p in group["params"]}
    assert optimised == {id(p) for p in task.net.parameters() if p.requires_grad}


@pytest.mark.parametrize("family", [f for f in LORA_FAMILIES if f != "llama"])  # llama: the gpt family's network
def test_a_step_leaves_the_base_untouched_and_merging_gives_the_adapted_function(family) -> None:
    task = build_task(family, "model.lora.rank=2", "model.lora.alpha=4")
    net = task.net.double()
    base = {name.replace(".base_layer", ""): t.clone() for name, t in net.state_dict().items() if "lora_" not in name}
    inputs = family_inputs("gpt" if family == "llama" else family)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.5)
    net.train()
    out = net(*inputs)
    sum(o.square().mean() for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point()).backward()
    optimizer.step()
    saved = tuple(f"{name}." for name in task.lora.modules_to_save)
    for name, tensor in net.state_dict().items():
        if "lora_" not in name and not name.startswith(saved):
            assert torch.equal(tensor, base[name.replace(".base_layer", "")]), name
    net.eval()
    with torch.no_grad():
        adapted = net(*inputs)
        merged = merge_lora(net)(*inputs)
    assert set(net.state_dict()) == set(base)  # plain parameter names again
    torch.testing.assert_close(merged, adapted)


def test_a_family_without_transformer_blocks_refuses_lora_in_one_line(tmp_path, capsys) -> None:
    args = ["model=rnn_translation", *TINY["rnn_translation"], "model.lora.rank=4", f"hydra.run.dir={tmp_path}"]
    code, out, err = run_in_process(args, capsys)
    assert code == 2, (out + err)[-2000:]
    message = (
        "model.lora.rank=4: LoRA adapts the attention and MLP projections of Transformer blocks and the "
        "rnn_translation family has none; set model.lora.rank=0"
    )
    assert message in err and "Traceback" not in err


def train(args: list[str], run_dir: Path, capsys) -> Path:
    code, out, err = run_in_process([*args, *STEPS, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 0, (out + err)[-4000:]
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_a_short_lora_run_from_the_command_line_loads_back_merged(family, tmp_path, capsys) -> None:
    path = train([f"model={family}", *TINY[family], "model.lora.rank=2"], tmp_path / "run", capsys)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["lora"]["rank"] == 2
    state = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items()}
    assert any("lora_" in key for key in state)
    tuned = zoo.load(path)  # base + adapters, merged: the plain network's parameter names
    assert not any("lora_" in key or "base_layer" in key for key in tuned.state_dict())
    base = {key.replace(".base_layer", ""): v for key, v in state.items() if "lora_" not in key}
    assert set(tuned.state_dict()) == set(base)
    changed = {k for k, v in tuned.state_dict().items() if not torch.equal(v, base[k])}
    saved = tuple(f"{name}." for name in checkpoint["hyper_parameters"]["lora"]["modules_to_save"])
    assert changed and all(ADAPTED.fullmatch(k.removesuffix(".weight")) for k in changed if not k.startswith(saved))


def test_lora_on_a_pretrained_vit_keeps_what_trained_names_the_base_and_loads_back(tmp_path, capsys) -> None:
    from zoo.models.vit import ViT, ViTConfig

    torch.manual_seed(1)
    donor = ViT(ViTConfig(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3))
    weights = tmp_path / "base.pt"
    torch.save(donor.state_dict(), weights)
    path = train(["model=vit", *TINY["vit"], f"model.pretrained={weights}", "model.lora.rank=2"], tmp_path / "run",
                 capsys)  # fmt: skip
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["pretrained"] == str(weights.resolve())  # names its base
    keys = [k.removeprefix("net.") for k in checkpoint["state_dict"]]
    assert keys and all("lora_" in k or k.startswith("head.") for k in keys)  # adapters and the new head only
    tuned = zoo.load(path)
    for name, tensor in donor.state_dict().items():  # the trunk is the base's, adapted projections aside
        if not name.startswith("head.") and not ADAPTED.fullmatch(name.removesuffix(".weight")):
            assert torch.equal(tuned.state_dict()[name], tensor), name
    assert tuned.head.out_features == 10  # digits' classes, trained from the checkpoint's head


def test_lora_on_a_pretrained_clip_folder_keeps_the_adapters_names_the_base_and_loads_back(tmp_path, capsys) -> None:
    from tests.tasks.test_clip import huggingface_clip_folder
    from zoo.models.clip import CLIP

    folder = tmp_path / "hf"
    huggingface_clip_folder(folder)
    path = train(["model=clip", f"model.pretrained={folder}", "model.lora.rank=2", "data.max_length=40"],
                 tmp_path / "run", capsys)  # fmt: skip
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["pretrained"] == str(folder.resolve())
    assert checkpoint["state_dict"] and all("lora_" in key for key in checkpoint["state_dict"])  # adapters only
    base, tuned = CLIP.from_pretrained(folder).state_dict(), zoo.load(path).state_dict()
    assert set(tuned) == set(base)
    changed = {k for k, v in tuned.items() if not torch.equal(v, base[k])}
    assert changed and all(ADAPTED.fullmatch(k.removesuffix(".weight")) for k in changed)
