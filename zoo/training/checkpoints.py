"""Checkpoint files as zoo writes and checks them: atomic writes (a crash while saving leaves the previous
file whole; a full or read-only disk is one MachineFault naming the folder, its free space and the last good
checkpoint), every read through zoo.weights (weights_only), the newest intact checkpoint of a run, and one
clear line when a checkpoint belongs to another model family (`check_task`) or another configuration of the
same one (`check_weights`)."""

from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from zoo.errors import CheckpointError, MachineFault, storage_failure, storage_message
from zoo.weights import checkpoint_identity, read_checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into `.<name>.<pid>.tmp` next to the target, fsync, then os.replace: readers (and a
    resume after SIGKILL) see either the old file or the complete new one, never a truncated one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote filesystems: Lightning's own writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed mid-save
                stale.unlink(missing_ok=True)
            with open(temporary, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            failure = storage_failure(error)
            if failure is not None:
                raise storage_fault(failure, path, path.parent) from error
            raise
        fsync_directory(path.parent)

    def load_checkpoint(self, path: str | Path, map_location: Any = None, weights_only: bool | None = None) -> dict:
        # Lightning's resume reads through here too: zoo's reader, always weights_only.
        return read_checkpoint(path, map_location=map_location or "cpu")


def newest_intact_checkpoint(folder: Path, skip: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The most recently written checkpoint in `folder` (other than `skip`) that reads whole, with its contents;
    None if there is none. Temporaries of interrupted saves (`.<name>.<pid>.tmp`) are never candidates."""
    if not folder.is_dir():
        return None
    candidates = [p for p in folder.glob("*.ckpt") if p.is_file() and p != skip]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            return candidate, read_checkpoint(candidate)
        except CheckpointError:
            continue
    return None


def last_good_checkpoint_note(folder: Path | None) -> str:
    found = newest_intact_checkpoint(folder) if folder is not None else None
    if found is None:
        return "no checkpoint had been written yet"
    path, checkpoint = found
    return f"the last good checkpoint is kept: {path} (step {checkpoint.get('global_step', '?')})"


def storage_fault(failure: OSError, target: str | Path, checkpoints: Path | None) -> MachineFault:
    """A write refused by the disk as one line: the file, why, the free space where it went, and the newest
    checkpoint in `checkpoints` that is still whole."""
    return MachineFault(f"{storage_message(failure, target)}; {last_good_checkpoint_note(checkpoints)}")


def fsync_directory(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def short_name(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def task_class(target: str) -> type | None:
    """The class an import path names (a task's `_target_`), or None if it does not import."""
    import importlib

    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def check_task(checkpoint: dict[str, Any], target: str, path: str, model: str | None = None) -> None:
    """Refuse a checkpoint written by another task (`_target_`) than the one configured.

    zoo's checkpoints say who wrote them (zoo.weights.checkpoint_identity); for others the saved
    hyper-parameters must be arguments the configured task accepts.
    """
    written_by, family = checkpoint_identity(checkpoint)
    configured = f"{short_name(target)}" + (f" (model={model})" if model else "")
    if written_by and written_by != target:
        family = family or getattr(task_class(written_by), "family", None)
        raise CheckpointError(
            f"ckpt_path={path!r} was written by {short_name(written_by)}"
            + (f" (model={family})" if family else "")
            + f", not by {configured}"
            + (f"; pass model={family}" if family else "")
        )
    if written_by:
        return
    hparams = checkpoint.get("hyper_parameters") or {}
    task = task_class(target)
    if task is None:
        return
    parameters = inspect.signature(task).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    foreign = sorted(set(hparams) - set(parameters))
    if foreign:
        raise CheckpointError(
            f"ckpt_path={path!r} belongs to another model family: its hyper-parameters {foreign} are not "
            f"arguments of {configured}; valid arguments: {sorted(p for p in parameters if p != 'self')}"
        )


# Marks a checkpoint that holds what LoRA trained only (adapters, lora.modules_to_save), its base named by the task's
# `pretrained` hyper-parameter.
ADAPTERS_ONLY = "adapters_only"


def check_weights(checkpoint: dict[str, Any], module: torch.nn.Module, path: str) -> None:
    """Refuse a checkpoint whose weights do not fit `module` (missing or reshaped tensors), naming the first
    mismatch, before Lightning fails with a page of key names. Weights the module does not have yet (a net
    built lazily in setup) are not judged here."""
    saved = checkpoint["state_dict"]
    expected = module.state_dict()
    if checkpoint.get(ADAPTERS_ONLY):  # LoRA of a named base: the base's weights come from the base
        expected = {k: v for k, v in expected.items() if "lora_" in k or k in saved}
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
