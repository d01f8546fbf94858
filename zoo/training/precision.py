"""Mixed precision that clips gradients with any optimiser, fused Adam/AdamW included.

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
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_warn

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


def mixed_precision_plugin(precision: Any, accelerator: str, strategy: Any = None) -> MixedPrecision | None:
    """zoo's MixedPrecision for a Trainer's `precision` flag, or None where Lightning's own plugin applies
    (full precision, and strategies with precision plugins of their own: FSDP, DeepSpeed)."""
    mode = MIXED_PRECISIONS.get(str(precision))
    target = str((strategy or {}).get("_target_", strategy) if isinstance(strategy, dict) else strategy or "")
    if mode is None or any(name in target.lower() for name in ("fsdp", "deepspeed")):
        return None
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        device = "cuda"
    elif accelerator == "mps":
        device = "mps"
    else:
        device = "cpu"
    if device == "cpu" and mode == "16-mixed":
        rank_zero_warn(
            "trainer.precision=16-mixed runs as bf16-mixed on the CPU (as in Lightning): fp16 AMP is for GPUs"
        )
        mode = "bf16-mixed"
    return MixedPrecision(mode, device)
