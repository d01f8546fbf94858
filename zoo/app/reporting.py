"""Bad input as one line: `error: <message>` on stderr and exit status 2 (no traceback unless
HYDRA_FULL_ERROR=1); bugs keep their traceback. `user_error_message` turns the errors of Hydra, OmegaConf,
Lightning and zoo (zoo.errors) into that line, naming the bad value and what would be valid.
Kept free of torch and Lightning imports."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import traceback
from collections.abc import Iterator

from omegaconf import OmegaConf

from zoo.app.overrides import compose_defaults, is_group, split_override
from zoo.errors import USER_ERRORS, one_line

EXIT_BAD_INPUT = 2


def unwrap(error: BaseException) -> BaseException:
    """Hydra wraps errors raised inside `instantiate` (InstantiationException); the cause is what counts."""
    from hydra.errors import InstantiationException

    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def valid_keys(parent: str, args: list[str]) -> list[str] | None:
    """The keys under `parent` in the config these arguments select (None if that cannot be composed)."""
    cfg = compose_defaults(args)
    if cfg is None:
        return None
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return sorted(str(k) for k in node) if OmegaConf.is_dict(node) else None


def override_type_message(args: list[str]) -> str | None:
    """`trainer.max_epochs=abc` -> "trainer.max_epochs must be an int like its default 80, got 'abc'".

    Hydra accepts any value for any key, and a string where a number belongs fails deep inside a library;
    when a run fails that way, this names the override. None if every override has its default's type."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in args if (parsed := split_override(a)) and not is_group(parsed[0].split("@", 1)[0])]
    if not overrides:
        return None
    cfg = compose_defaults(args)
    try:
        parsed_overrides = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None
    for override in parsed_overrides:
        if cfg is None or override.is_sweep_override() or override.is_delete():
            continue
        key = override.key_or_group
        try:
            default = OmegaConf.select(cfg, key, throw_on_missing=False)
        except Exception:
            continue
        value = override.value()
        expected = {bool: "true or false", int: "an int", float: "a number"}.get(type(default))
        if expected is None:
            continue
        fits = (
            isinstance(value, bool)
            if isinstance(default, bool)
            else (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and (isinstance(default, float) or isinstance(value, int))
            )
        )
        if not fits:
            return f"{key} must be {expected} like its default {default}, got {value!r}"
    return None


def unknown_key_message(key: str, args: list[str]) -> str:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    keys = valid_keys(parent, args)
    where = f" in {parent}" if parent else ""
    valid = f"; valid keys{where}: {', '.join(keys)}" if keys else ""
    return f"unknown key {key!r}{valid} (add a new key with +{key}=...)"


def unexpected_argument_message(error: TypeError, target: str | None) -> str | None:
    """`Trainer.__init__() got an unexpected keyword argument 'foo'` -> the bad name and the valid ones."""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if match is None:
        return None
    valid = ""
    if target:
        with contextlib.suppress(Exception):
            from hydra.utils import get_object

            params = inspect.signature(get_object(target)).parameters
            named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            valid = "; valid: " + ", ".join(n for n, p in params.items() if p.kind in named)
    return f"unknown option {match.group(1)!r} for {target or 'this object'}{valid}"


def user_error_message(error: BaseException, args: list[str] | None = None) -> str | None:
    """The one-line message for an error caused by bad input, or None for a bug (it keeps its traceback)."""
    from hydra.errors import (
        ConfigCompositionException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

    target = None
    if isinstance(error, InstantiationException):
        found = re.search(r"target '([\w.]+)'", str(error))
        target = found.group(1) if found else None
    error = unwrap(error)
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, name = str(error.missing_cfg_file).rpartition("/")
        return f"unknown {group} {name!r}; valid choices: {', '.join(error.options)}"
    if isinstance(error, ConfigCompositionException):
        bad = re.match(r"Could not override '([^']+)'", str(error))
        if bad and "not in struct" in str(error.__cause__):
            return unknown_key_message(bad.group(1), args or [])
        cause = f" ({one_line(str(error.__cause__).splitlines()[0])})" if error.__cause__ else ""
        return one_line(str(error).strip().splitlines()[0]) + cause
    if isinstance(error, OverrideParseException):
        return (
            f"cannot parse the override {error.override!r} ({one_line(str(error).strip().splitlines()[0])}); "
            "valid: key=value, lists as key=[a,b], values with spaces quoted: 'key=\"a b\"'"
        )
    if isinstance(error, OmegaConfBaseException):
        text = one_line(str(error).strip().splitlines()[0])
        key = getattr(error, "full_key", None)
        where = f"{key}: " if key and key not in text else ""
        hint = ""
        if isinstance(error, InterpolationKeyError) and "'data." in text:
            hint = "; this data=... does not provide what the model needs: pick a dataset made for the model"
        return where + text + hint
    if isinstance(error, TypeError) and (message := unexpected_argument_message(error, target)):
        return message
    if isinstance(error, user_error_types()):
        return one_line(str(error)) or type(error).__name__
    if refused_by_lightning_setup(error):
        return f"Lightning refuses this combination of settings: {one_line(str(error))}"
    return override_type_message(args) if args else None


# Where Lightning checks the trainer's settings (precision, accelerator, strategy, plugins): a RuntimeError
# raised there is a refused combination of options, not a bug.
LIGHTNING_SETUP = ("lightning/pytorch/plugins/", "lightning/pytorch/trainer/connectors/", "lightning/fabric/plugins/")


def refused_by_lightning_setup(error: BaseException) -> bool:
    if not isinstance(error, RuntimeError) or error.__traceback__ is None:
        return False
    innermost = traceback.extract_tb(error.__traceback__)[-1].filename.replace("\\", "/")
    return any(part in innermost for part in LIGHTNING_SETUP)


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (or a run that cannot go on, such as a non-finite loss). Library
    types are looked up only if the library is loaded: an error it never raised needs no import."""
    import pickle

    types: list[type[BaseException]] = [*USER_ERRORS, pickle.UnpicklingError]
    if "lightning" in sys.modules:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        types.append(MisconfigurationException)
    return tuple(types)


# Set by reporting_errors (run.py) to the user's own HYDRA_FULL_ERROR choice; None when zoo runs without it.
_traceback_wanted: bool | None = None


def full_error_requested() -> bool:
    """Whether the user asked for full tracebacks (HYDRA_FULL_ERROR=1)."""
    if _traceback_wanted is not None:
        return _traceback_wanted
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


@contextlib.contextmanager
def reporting_errors(args: list[str] | None = None) -> Iterator[None]:
    """Around run.py's Hydra main: bad input -> `error: <one line>` on stderr and exit status 2.

    Hydra prints its own errors (unknown keys, bad override syntax) over several lines; with
    HYDRA_FULL_ERROR set inside, they reach this handler instead. A user's HYDRA_FULL_ERROR=1 still shows
    every traceback; bugs (errors that are not bad input) keep theirs either way.
    """
    global _traceback_wanted
    previous = os.environ.get("HYDRA_FULL_ERROR")
    _traceback_wanted = previous == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Exception as error:
        if _traceback_wanted:
            raise
        message = user_error_message(error, args if args is not None else sys.argv[1:])
        if message is None:
            traceback.print_exc()
            sys.exit(1)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    finally:
        _traceback_wanted = None
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
