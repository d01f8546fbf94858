"""Secrets stay out of every printed or saved config: values of environment variables named like API keys,
tokens and passwords are shown as *** (the printed config tree, Hydra's .hydra/ files, the config sent to
W&B)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

# Environment variables whose values never reach a printed or saved config (W&B, Hugging Face, cloud keys).
SECRET_NAME = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def secret_values() -> list[str]:
    return sorted({v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 8}, key=len, reverse=True)


def redact(text: str) -> str:
    for secret in secret_values():
        text = text.replace(secret, "***")
    return text


def redacted(cfg: DictConfig) -> DictConfig:
    """A resolved copy of `cfg` with every secret value replaced by *** (for loggers that store the config)."""

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return redact(value) if isinstance(value, str) else value

    return OmegaConf.create(scrub(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)))


@rank_zero_only
def scrub_saved_config(output_dir: str | None) -> None:
    """Hydra saves the command line and config (.hydra/) before zoo runs; take secrets back out of them."""
    from hydra.core.hydra_config import HydraConfig

    if not output_dir or not HydraConfig.initialized() or HydraConfig.get().output_subdir is None:
        return
    for file in (Path(output_dir) / HydraConfig.get().output_subdir).glob("*.yaml"):
        text = file.read_text()
        if redact(text) != text:
            file.write_text(redact(text))
