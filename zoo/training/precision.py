"""Mixed precision that clips gradients with any optimiser, fused Adam/AdamW included, and `precision=auto`.

`auto` is the fastest precision that keeps quality on the machine at hand: bf16-mixed where the device computes
bf16 natively (CUDA GPUs with bf16, Ampere on; CPUs with AVX512-BF16 or AMX), 16-mixed on older CUDA GPUs and
32-true elsewhere. CPUs without native bf16 (AVX2-only ones, e.g. AMD Zen 3) emulate bf16 matmuls, far slower
than fp32 there, and bf16 training steps ran several times slower (figures in experiments/results/recipes.md).

Lightning's AMP plugin refuses gradient clipping whenever the optimiser "unscales gradients internally"
(`_step_supports_amp_scaling`: the fused Adam/AdamW zoo builds, the fastest step on CPU and CUDA), even in
bf16, which has no gradient scaler at all. zoo's plugin always unscales before clipping instead: bf16 has
nothing to unscale; for fp16, `GradScaler.unscale_` runs first and `GradScaler.step` then hands the fused
kernel `grad_scale=None` (the gradients are already unscaled) while still skipping a step with inf/NaN
gradients. Clipping then sees true gradient norms, as it does in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision as LightningMixedPrecision
from lightning.pytorch.plugins.precision.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_info, rank_zero_warn

from zoo.errors import ZooWarning
from zoo.hardware import native_bf16

# Lightning's precision names (lightning.fabric.connector._PRECISION_INPUT) and zoo's `auto`.
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "transformer-engine",
              "transformer-engine-float16", "32", "bf16", "16", "64")  # fmt: skip
MIXED_PRECISIONS = {"16-mixed": "16-mixed", "16": "16-mixed", "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed"}


class MixedPrecision(LightningMixedPrecision):
    """`torch.autocast` training (bf16-mixed, 16-mixed) whose gradients are unscaled before clipping."""

    def optimizer_step(
        self, optimizer: Any, model: L.LightningModule, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        if self.scaler is None:  # bf16: no scaling, the base class steps as in fp32
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        closure_result = closure()
        skipped_backward = closure_result is None and model.automatic_optimization
        if not skipped_backward:
            self.scaler.unscale_(optimizer)  # for fused optimisers too: clipping below sees true gradients
        self._after_closure(model, optimizer)
        if skipped_backward:
            return closure_result
        step_output = self.scaler.step(optimizer, **kwargs)  # skips the step on inf/NaN gradients
        self.scaler.update()
        return step_output

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        # Gradients are unscaled by now (optimizer_step), so the plain clipping is right for every optimiser.
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


def training_device(accelerator: str) -> str:
    """The device a Trainer with this `accelerator` flag trains on: "cuda", "mps" or "cpu"."""
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "cuda"
    if accelerator == "mps" or (accelerator == "auto" and torch.backends.mps.is_available()):
        return "mps"
    return "cpu"


def resolve_precision(precision: Any, accelerator: str) -> Any:
    """`trainer.precision` as Lightning takes it: `auto` becomes the fastest precision that keeps quality on
    this device (module docstring); bf16-mixed asked for by name on a CPU without native bf16 is kept, with a
    warning. Lightning's own names pass through; anything else is a one-line error naming the choices."""
    if precision is None:  # Lightning's default, 32-true
        return None
    if str(precision) not in PRECISIONS:
        raise ValueError(f"trainer.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    device = training_device(accelerator)
    if str(precision) == "auto":
        name = {"cpu": "CPU", "cuda": "GPU"}.get(device, device)
        if native_bf16(device):
            chosen, why = "bf16-mixed", f"this {name} computes bf16 natively"
        elif device in ("cpu", "cuda"):
            chosen = "16-mixed" if device == "cuda" else "32-true"
            why = f"this {name} has no native bf16" + (": no AVX512-BF16 or AMX" if device == "cpu" else "")
        else:
            chosen, why = "32-true", device
        rank_zero_info(f"trainer.precision=auto: {chosen} ({why})")
        return chosen
    if device == "cpu" and str(precision).startswith(("bf16", "16")) and not native_bf16("cpu"):
        rank_zero_warn(
            f"trainer.precision={precision}: this CPU has no native bf16 (AVX512-BF16 or AMX) and emulates it, "
            "several times slower than 32-true (recipes.md); trainer.precision=auto picks the fastest",
            category=ZooWarning,
        )
    return precision


def mixed_precision_plugin(precision: Any, accelerator: str, strategy: Any = None) -> MixedPrecision | None:
    """zoo's MixedPrecision for a Trainer's `precision` flag, or None where Lightning's own plugin applies
    (full precision, and strategies with precision plugins of their own: FSDP, DeepSpeed)."""
    mode = MIXED_PRECISIONS.get(str(precision))
    target = str((strategy or {}).get("_target_", strategy) if isinstance(strategy, dict) else strategy or "")
    if mode is None or any(name in target.lower() for name in ("fsdp", "deepspeed")):
        return None
    device = training_device(accelerator)
    if device == "cpu" and mode == "16-mixed":
        rank_zero_warn(
            "trainer.precision=16-mixed runs as bf16-mixed on the CPU (as in Lightning): fp16 AMP is for GPUs",
            category=ZooWarning,
        )
        mode = "bf16-mixed"
    return MixedPrecision(mode, device)
