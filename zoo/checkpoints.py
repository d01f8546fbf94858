"""Reading checkpoints safely: tensors and plain values only, and one clear line when a file cannot be used.

Every checkpoint zoo reads goes through `load_checkpoint` (`torch.load(..., weights_only=True)`: a pickle
that would import and call code is refused, not run). `check_task` and `check_weights` say when a
checkpoint belongs to another model family or another configuration of the same one.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as given; the message names the file and what would work."""


def nearby_checkpoints(path: Path, limit: int = 4) -> str:
    folder = path.parent if path.parent.is_dir() else None
    found = sorted(p.name for p in folder.glob("*.ckpt")) if folder else []
    if found:
        return f"; checkpoints in {folder}: {', '.join(found[:limit])}" + (" ..." if len(found) > limit else "")
    return "; pass a .ckpt file from outputs/<model>/<run>/checkpoints/"


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, read with weights_only=True; CheckpointError for a missing, empty, truncated,
    corrupt or code-carrying file, or one that is not a Lightning checkpoint."""
    file = Path(path).expanduser()
    name = f"ckpt_path={str(path)!r}"
    if not file.is_file():
        raise CheckpointError(f"{name} is not a file{nearby_checkpoints(file)}")
    if file.stat().st_size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes): its save was cut off{nearby_checkpoints(file)}")
    try:
        checkpoint = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:
        code = re.search(r"GLOBAL ([\w.]+)", str(error))
        if code:
            raise CheckpointError(
                f"{name} was refused: it holds a pickled Python object ({code.group(1)}) that loading would run; "
                "zoo only reads tensors and plain values (torch.load weights_only=True)"
            ) from None
        raise CheckpointError(
            f"{name} is truncated or corrupt ({type(error).__name__}); use an intact checkpoint"
            f"{nearby_checkpoints(file)}"
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"{name} is not a Lightning checkpoint (no state_dict){nearby_checkpoints(file)}")
    return checkpoint


def short_name(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def check_task(checkpoint: dict[str, Any], target: str, path: str, model: str | None = None) -> None:
    """Refuse a checkpoint written by another task (`_target_`) than the one configured.

    zoo's checkpoints say who wrote them (checkpoint["zoo"], from zoo.callbacks.ResumeState); for others
    the saved hyper-parameters must be arguments the configured task accepts.
    """
    written_by = (checkpoint.get("zoo") or {}).get("task")
    configured = f"{short_name(target)}" + (f" (model={model})" if model else "")
    if written_by and written_by != target:
        their_model = (checkpoint.get("zoo") or {}).get("model")
        hint = f"; pass model={their_model}" if their_model else ""
        raise CheckpointError(
            f"ckpt_path={path!r} was written by {short_name(written_by)}"
            + (f" (model={their_model})" if their_model else "")
            + f", not by {configured}{hint}"
        )
    if written_by:
        return
    hparams = checkpoint.get("hyper_parameters") or {}
    try:
        from hydra.utils import get_class

        parameters = inspect.signature(get_class(target)).parameters
    except Exception:
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    foreign = sorted(set(hparams) - set(parameters))
    if foreign:
        raise CheckpointError(
            f"ckpt_path={path!r} belongs to another model family: its hyper-parameters {foreign} are not "
            f"arguments of {configured}; valid arguments: {sorted(p for p in parameters if p != 'self')}"
        )


def check_weights(checkpoint: dict[str, Any], module: torch.nn.Module, path: str) -> None:
    """Refuse a checkpoint whose weights do not fit `module` (missing or reshaped tensors), naming the first
    mismatch, before Lightning fails with a page of key names. Weights the module does not have yet (a net
    built lazily in setup) are not judged here."""
    saved = checkpoint["state_dict"]
    expected = module.state_dict()
    missing = [k for k in expected if k not in saved]
    reshaped = [k for k in expected if k in saved and tuple(saved[k].shape) != tuple(expected[k].shape)]
    if reshaped:
        key = reshaped[0]
        raise CheckpointError(
            f"ckpt_path={path!r} does not fit the configured model: {key} is {tuple(saved[key].shape)} in the "
            f"checkpoint but {tuple(expected[key].shape)} here ({len(reshaped)} tensors differ); run with the "
            "overrides it was trained with (its run's .hydra/overrides.yaml)"
        )
    if missing:
        raise CheckpointError(
            f"ckpt_path={path!r} does not fit the configured model: {len(missing)} of its {len(expected)} weights "
            f"are missing (e.g. {missing[0]}); is it a checkpoint of another model?"
        )
