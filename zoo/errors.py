"""zoo's error types and the checks that raise them: one leaf module every layer may import.

Every error here means input that cannot be used as given (a value, a file, a folder); its message is one
line naming the bad value and what would be valid. The command line (zoo/app/reporting.py) prints such an
error as `error: <message>` and exits with status 2; anything else is a bug and keeps its traceback.
Kept free of torch and of every other zoo module.
"""

from __future__ import annotations

from typing import Any


class UsageError(ValueError):
    """A command line or setting that cannot run as given."""


class DataError(ValueError):
    """Data that cannot be used as given: the message names the file or value and what would be valid."""


class CheckpointError(ValueError):
    """A checkpoint or weight file that cannot be used as given; the message names the file and what would work."""


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss: the run cannot go on (reported in one line, like bad input)."""


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


def check_choice(name: str, value: Any, choices: Any) -> None:
    """ValueError naming `name` and the valid choices unless value is one of them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(map(str, sorted(choices)))}")
