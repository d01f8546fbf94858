"""The devices a run asks for must exist: one line naming what is there (Lightning would start more CPU
processes than cores, or fail later with a long message for a missing GPU)."""

from __future__ import annotations

import os
import re

import torch
from omegaconf import DictConfig


def available_devices(accelerator: str) -> tuple[str, int]:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "GPU", torch.cuda.device_count()
    if accelerator == "mps":
        return "MPS device", int(torch.backends.mps.is_available())
    if accelerator in ("cpu", "auto"):
        return "CPU core", os.cpu_count() or 1
    return accelerator, -1  # others (tpu, custom): Lightning checks


def check_devices(trainer: DictConfig) -> None:
    """trainer.devices must fit the machine: ValueError naming what is there (Lightning itself would start
    more CPU processes than cores, or fail later with a long message for a missing GPU)."""
    devices = trainer.get("devices", "auto")
    kind, available = available_devices(str(trainer.get("accelerator", "auto")))
    if devices in ("auto", -1, "-1", None) or available < 0:
        return
    if isinstance(devices, str) and re.fullmatch(r"\d+", devices.strip()):
        devices = int(devices)
    if isinstance(devices, int):
        count, highest = devices, devices - 1
    else:
        indices = [int(i) for i in str(devices).replace("[", "").replace("]", "").split(",") if i.strip()]
        count, highest = len(indices), max(indices, default=0)
    if available == 0:
        accelerator = trainer.get("accelerator")
        raise ValueError(f"trainer.accelerator={accelerator} but this machine has no {kind}; valid: cpu or auto")
    if count <= 0 or highest >= available:
        raise ValueError(
            f"trainer.devices={devices} but this machine has {available} {kind}(s); valid: 1..{available}, -1 or auto"
        )
