"""Mixed precision with gradient clipping (zoo/training/precision.py): the fused optimisers zoo builds clip too, and
they clip the true (unscaled) gradients, in bf16 and in fp16 with a gradient scaler."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from zoo.errors import ZooWarning
from zoo.training import precision as precision_module
from zoo.training.precision import MixedPrecision, mixed_precision_plugin, resolve_precision

CLIP = 1e-4


class TinyRegression(L.LightningModule):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 4)
        self.fused = fused

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x).float(), y) * 10  # a gradient norm far above CLIP

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=self.fused, foreach=None if self.fused else False)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x, y = torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator)
        return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=16)


def first_step_gradient_norm(precision: str, fused: bool) -> float:
    """Train one step; AdamW's first moment after one step is (1 - beta1) * the gradient it was given."""
    torch.manual_seed(0)
    module = TinyRegression(fused)
    plugin = MixedPrecision(precision, "cpu")
    if precision == "16-mixed":  # Lightning makes no scaler for CPU fp16; the scaler path is what is tested
        plugin.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer = L.Trainer(
        accelerator="cpu", plugins=[plugin], gradient_clip_val=CLIP, max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    optimizer = trainer.optimizers[0]
    moments = [optimizer.state[p]["exp_avg"] for p in module.parameters()]
    return float(torch.linalg.vector_norm(torch.stack([m.norm() for m in moments]))) / (1 - 0.9)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_gradients_are_clipped_to_the_limit_in_mixed_precision(precision: str, fused: bool) -> None:
    norm = first_step_gradient_norm(precision, fused)
    # Clipped, and clipped after unscaling: fp16 gradients clipped while still scaled by 2**10 would be
    # far below the limit once the optimiser unscales them.
    assert norm == pytest.approx(CLIP, rel=1e-3)


def test_zoo_plugin_replaces_lightnings_only_for_mixed_precision_without_sharded_strategies() -> None:
    assert mixed_precision_plugin("32-true", "cpu") is None
    assert mixed_precision_plugin("bf16-mixed", "cpu").precision == "bf16-mixed"
    with pytest.warns(ZooWarning, match="16-mixed runs as bf16-mixed on the CPU"):
        assert mixed_precision_plugin("16-mixed", "cpu").precision == "bf16-mixed"  # CPU: as Lightning does
    assert mixed_precision_plugin("bf16-mixed", "cpu", {"_target_": "zoo.training.distributed.fsdp_strategy"}) is None
    assert mixed_precision_plugin("bf16-mixed", "cpu", {"_target_": "lightning.pytorch.strategies.DDPStrategy"})


@pytest.mark.parametrize(
    ("native", "accelerator", "expected"),
    [
        ({"cpu"}, "cpu", "bf16-mixed"),  # AVX512-BF16 / AMX
        (set(), "cpu", "32-true"),  # AVX2 only: emulated bf16 is ~40x slower than fp32
        ({"cuda"}, "gpu", "bf16-mixed"),  # Ampere on
        (set(), "cuda", "16-mixed"),  # older GPUs
        ({"cpu"}, "mps", "32-true"),
    ],
)
def test_auto_precision_is_bf16_only_where_the_device_computes_it_natively(
    native: set[str], accelerator: str, expected: str, monkeypatch
) -> None:
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: device in native)
    assert resolve_precision("auto", accelerator) == expected


def test_precision_by_name_is_kept_and_an_unknown_one_names_the_choices(monkeypatch) -> None:
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: False)
    for name in ("bf16-mixed", "bf16-true"):
        with pytest.warns(UserWarning, match="no native bf16"):
            assert resolve_precision(name, "cpu") == name
    assert resolve_precision("32-true", "cpu") == "32-true" and resolve_precision(None, "cpu") is None
    with pytest.raises(ValueError, match=r"trainer.precision must be one of auto, 32-true, .*got 'fp8'"):
        resolve_precision("fp8", "cpu")


def test_the_cpu_probe_answers_for_this_machine() -> None:
    """The probe runs here (a bool, from torch's own CPU feature checks) and agrees with oneDNN's bf16 support."""
    answer = precision_module.native_bf16("cpu")
    assert isinstance(answer, bool)
    if answer:
        assert torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_a_setting_lightning_refuses_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch) -> None:
    """Should a refused combination slip through again (here: Lightning's own clipping check put back), the
    user gets the one-line error path."""
    from lightning.pytorch.plugins.precision import MixedPrecision as LightningMixedPrecision

    from tests.helpers import run_in_process

    monkeypatch.setattr(MixedPrecision, "clip_gradients", LightningMixedPrecision.clip_gradients)
    args = ["model=vit", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "debug=fdr",
            "trainer.precision=bf16-mixed", "trainer.gradient_clip_val=1.0", "print_config=false",
            f"hydra.run.dir={tmp_path}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err[-3000:]
    assert lines[0].startswith("error: Lightning refuses") and "gradient clipping" in lines[0]
