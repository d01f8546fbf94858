"""What this machine's processors do in hardware: a leaf every layer may ask (the models to pick a kernel, the
training layer to pick a precision)."""

from __future__ import annotations

import torch


def native_bf16(device: str) -> bool:
    """Whether `device` ("cpu", "cuda", "mps") multiplies bf16 matrices in hardware rather than emulating them."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device == "cpu":  # x86 probes; other CPUs answer False (fp32, the safe choice)
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    return False
