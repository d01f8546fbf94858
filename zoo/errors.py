"""zoo's error types and the checks that raise them: one leaf module every layer may import.

Every error here means input that cannot be used as given (a value, a file, a folder); its message is one
line naming the bad value and what would be valid. The command line (zoo/app/reporting.py) prints such an
error as `error: <message>` and exits with status 2; anything else is a bug and keeps its traceback.
MachineFault is the other kind: the machine failed the run (a full or read-only disk, a process that died); its
line names what failed, where, and the last good checkpoint, and the exit status is 3 (resumable once fixed).
Kept free of torch and of every other zoo module.
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ZooWarning(UserWarning):
    """A warning of zoo's own: the run goes on, but a setting does less than asked or costs more than needed
    (the test suite turns these into errors, so every one a test meets is one it expects)."""


class UsageError(ValueError):
    """A command line or setting that cannot run as given."""


class DataError(ValueError):
    """Data that cannot be used as given: the message names the file or value and what would be valid."""


class CheckpointError(ValueError):
    """A checkpoint or weight file that cannot be used as given; the message names the file and what would work."""


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss: the run cannot go on (reported in one line, like bad input)."""


class MachineFault(RuntimeError):
    """The machine failed the run, not its input: a full, read-only or unwritable disk, a training process or a
    data-loader worker that died. The message names what failed, where, and the last good checkpoint; once the
    fault is fixed, resuming continues the run."""


class PlacementError(ValueError):
    """An attention variant or position option that this attention cannot take where it was put: `option` and
    `value` (variant / compressed, position_bias / alibi) need `needs`: "bidirectional" (a self-attention that
    is not causal) or "sequence" (tokens in a row, not a patch grid). Each model family declares where its
    attentions are (`AttentionPlacement`, on its task); the command line's error names the placement that fits."""

    def __init__(self, message: str, option: str = "", value: Any = None, needs: str = "") -> None:
        super().__init__(message)
        self.option, self.value, self.needs = option, value, needs


@dataclass(frozen=True)
class AttentionPlacement:
    """One attention of a model family: `where` in words, the `override` that sets an option there only
    ({option} and {value} filled in), whether it is `causal` and whether its tokens lie on a patch `grid`;
    `variants`: the only variants it takes (None: every one), `positions`: whether it takes RoPE and position
    biases (a cross-attention has no positions to give)."""

    where: str
    override: str
    causal: bool
    grid: bool
    variants: tuple[str, ...] | None = None
    positions: bool = True

    def takes(self, needs: str, option: str = "", value: Any = None) -> bool:
        if option == "variant" and self.variants is not None and value not in self.variants:
            return False
        if option in ("rope", "position_bias") and not self.positions:
            return False
        return {"bidirectional": not self.causal, "sequence": not self.grid}.get(needs, False)

    def command(self, option: str, value: Any) -> str:
        return self.override.format(option=option, value=value)


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError, NonFiniteLossError)


def one_line(text: str) -> str:
    """Whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    """ValueError naming `name` unless value is a positive int (bools are not ints here), or None if allowed."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        choices = "a positive int or null" if allow_none else "a positive int"
        raise ValueError(f"{name} must be {choices}, got {value!r}")


def check_non_negative(name: str, value: Any) -> None:
    """ValueError naming `name` unless value is a number >= 0 (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


class ChoiceError(ValueError):
    """A value that is not one of a setting's named choices. Code reads `.choices` (the message is for people)."""

    def __init__(self, name: str, value: Any, choices: Any) -> None:
        self.name, self.value, self.choices = name, value, tuple(sorted(choices))
        super().__init__(f"unknown {name} {value!r}; valid choices: {', '.join(map(str, self.choices))}")

    def __reduce__(self):  # pickled with its fields (a DataLoader worker re-raises it in the main process)
        return type(self), (self.name, self.value, self.choices)


def check_choice(name: str, value: Any, choices: Any) -> None:
    """ChoiceError (a ValueError) naming `name` and the valid choices unless value is one of them."""
    if value not in choices:
        raise ChoiceError(name, value, choices)


# ---------------------------------------------------------------------------------------------------------
# Disks that refuse a write
# ---------------------------------------------------------------------------------------------------------
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def storage_failure(error: BaseException | None) -> OSError | None:
    """The OSError of a full, read-only or unwritable disk behind `error` (itself, or what it was raised from or
    while handling: torch's zip writer reports a full disk as a RuntimeError raised while handling ENOSPC)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def free_space(path: str | Path) -> str:
    """'1.2 MB free of 2.6 MB' for the file system holding `path` (or its nearest existing parent)."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "free space unknown"
    return f"{human_bytes(usage.free)} free of {human_bytes(usage.total)}"


def storage_message(failure: OSError, target: str | Path | None = None) -> str:
    """`cannot write <file>: no space left on device (0 B free of 2.6 MB in <folder>)` (`cannot access` for a
    permission error, which a read meets too)."""
    target = Path(target or failure.filename or ".")
    folder = target if target.is_dir() else target.parent
    verb = "cannot access" if failure.errno in (errno.EACCES, errno.EPERM) else "cannot write"
    return f"{verb} {target}: {STORAGE_ERRNOS[failure.errno]} ({free_space(folder)} in {folder})"
