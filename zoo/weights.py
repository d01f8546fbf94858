"""The one reader of checkpoints and weight files: tensors and plain values only, never code.

Every file zoo reads weights from goes through here: `.safetensors` with safetensors, anything else with
`torch.load(..., weights_only=True)` (a pickle that would import and call code is refused, not run).
Lightning checkpoints are unwrapped to the network's own state dict: zoo's tasks hold the network as `net`,
and `torch.compile` wraps it as `_orig_mod`; both prefixes are stripped wherever they stand. Problems are one
CheckpointError naming the file and what would work.

Checkpoint identity: zoo writes `checkpoint["zoo"] = {"task": <task class import path>, "family": <family>}`
(zoo/tasks/base.py). Checkpoints from before that marker said `{"task", "model"}` and, for GPT,
`checkpoint["model_family"]`; `checkpoint_family` reads all three. Task classes keep their import paths
(zoo.tasks.<module>.<Class>): checkpoints name them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from zoo.errors import CheckpointError

NETWORK_PREFIX = "net."  # zoo's tasks hold the network as `self.net`
COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper


def _nearby(path: Path, what: str = "ckpt_path", limit: int = 4) -> str:
    """Where to look instead: the checkpoints next to a checkpoint that cannot be used."""
    if what != "ckpt_path":
        return ""
    folder = path.parent if path.parent.is_dir() else None
    found = sorted(p.name for p in folder.glob("*.ckpt")) if folder else []
    if found:
        return f"; checkpoints in {folder}: {', '.join(found[:limit])}" + (" ..." if len(found) > limit else "")
    return "; pass a .ckpt file from outputs/<model>/<run>/checkpoints/"


def load_file(path: str | Path, what: str = "ckpt_path", map_location: Any = "cpu") -> Any:
    """The object stored in a torch.save / safetensors file, read without running code."""
    file = Path(path).expanduser()
    name = f"{what}={str(path)!r}"
    if not file.is_file():
        raise CheckpointError(f"{name} is not a file{_nearby(file, what)}")
    if file.stat().st_size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes): its save was cut off{_nearby(file, what)}")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file as load_safetensors

        try:
            return load_safetensors(str(file), device=str(map_location or "cpu"))
        except Exception as error:
            raise CheckpointError(f"{name} is not a readable safetensors file ({type(error).__name__})") from None
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:
        code = re.search(r"GLOBAL ([\w.]+)", str(error))
        if code:
            raise CheckpointError(
                f"{name} was refused: it holds a pickled Python object ({code.group(1)}) that loading would run; "
                "zoo only reads tensors and plain values (torch.load weights_only=True)"
            ) from None
        raise CheckpointError(
            f"{name} is truncated or corrupt: not a readable state dict or checkpoint ({type(error).__name__})"
            f"{_nearby(file, what)}"
        ) from None


def read_checkpoint(path: str | Path, what: str = "ckpt_path", map_location: Any = "cpu") -> dict[str, Any]:
    """A Lightning checkpoint's dict; CheckpointError for a missing, empty, truncated, corrupt or
    code-carrying file, or one that is not a Lightning checkpoint."""
    checkpoint = load_file(path, what, map_location)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        nearby = _nearby(Path(path).expanduser(), what)
        raise CheckpointError(f"{what}={str(path)!r} is not a Lightning checkpoint (no state_dict){nearby}")
    # zoo compiles networks in place (parameter names unchanged); checkpoints of older compiled runs
    # name their weights net._orig_mod.*: read them as if written uncompiled.
    checkpoint["state_dict"] = {
        key.replace(COMPILED_PREFIX, ""): value for key, value in checkpoint["state_dict"].items()
    }
    return checkpoint


def network_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A task's state dict -> its network's: keys under `net.`, with every `_orig_mod.` (torch.compile) removed."""
    return {
        key.removeprefix(NETWORK_PREFIX).replace(COMPILED_PREFIX, ""): value
        for key, value in state_dict.items()
        if key.startswith(NETWORK_PREFIX)
    }


def read_weights(path: str | Path, what: str = "model.pretrained") -> dict[str, torch.Tensor]:
    """A network's state dict from a weight file: a plain state dict (torch.save or .safetensors), a zoo
    or Lightning checkpoint (its network's weights), or a training checkpoint holding one under "model"."""
    obj = load_file(path, what)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        state = obj["state_dict"]
        obj = network_state_dict(state) if any(k.startswith(NETWORK_PREFIX) for k in state) else state
    elif isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not obj or not all(torch.is_tensor(value) for value in obj.values()):
        raise CheckpointError(f"{what}={str(path)!r} holds no state dict of tensors")
    return {key.replace(COMPILED_PREFIX, ""): value for key, value in obj.items()}


def identity(module: Any) -> dict[str, str | None]:
    """The marker a checkpoint of `module` carries: its task class's import path and model family."""
    task = type(module)
    return {"task": f"{task.__module__}.{task.__qualname__}", "family": getattr(task, "family", None) or None}


def checkpoint_identity(checkpoint: dict[str, Any]) -> tuple[str | None, str | None]:
    """(task import path, model family) of a zoo checkpoint; None where it does not say."""
    marker = checkpoint.get("zoo") or {}
    return marker.get("task"), marker.get("family") or marker.get("model") or checkpoint.get("model_family")


HUGGINGFACE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                       "pytorch_model.bin.index.json")  # fmt: skip


def read_huggingface_folder(folder: str | Path, what: str = "model.pretrained") -> tuple[dict[str, Any], dict]:
    """(config.json as a dict, state dict) of a folder written by transformers' save_pretrained: one
    model.safetensors or the shards its index names; a pickle pytorch_model.bin only if it loads as tensors
    (weights_only=True), like every file here."""
    import json

    root = Path(folder).expanduser()
    if not (root / "config.json").is_file():
        raise CheckpointError(f"{what}={str(folder)!r} has no config.json; valid: a Hugging Face model folder")
    try:
        config = json.loads((root / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{root / 'config.json'} is not valid JSON") from None
    present = [name for name in HUGGINGFACE_WEIGHTS if (root / name).is_file()]
    if not present:
        raise CheckpointError(f"{what}={str(folder)!r} holds no weights; valid: {', '.join(HUGGINGFACE_WEIGHTS)}")
    name = present[0]
    if name.endswith(".index.json"):
        try:
            weight_map = json.loads((root / name).read_text()).get("weight_map") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            raise CheckpointError(
                f"{what}={str(folder)!r}: {root / name} is not valid JSON (cut off?); save the model again, or "
                "delete the index if one model.safetensors holds every weight"
            ) from None
        files = sorted(set(weight_map.values()))
    else:
        files = [name]
    state: dict[str, torch.Tensor] = {}
    for file in files:
        part = load_file(root / file, what)
        if not isinstance(part, dict) or not all(torch.is_tensor(value) for value in part.values()):
            raise CheckpointError(f"{what}: {root / file} holds no state dict of tensors")
        state.update(part)
    return config, state
