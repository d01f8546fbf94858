"""Bad input as one line: `error: <message>` on stderr and exit status 2 (no traceback unless
HYDRA_FULL_ERROR=1); bugs keep their traceback. `user_error_message` turns the errors of Hydra, OmegaConf,
Lightning and zoo (zoo.errors) into that line, naming the bad value and what would be valid (the closest valid
key for a typo). Faults of the machine (zoo.errors.MachineFault: a full or read-only disk, a process that
died) are one line too, with exit status 3: once fixed, resuming continues the run.
Kept free of torch and Lightning imports."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
import sys
import traceback
from collections.abc import Iterator

from omegaconf import OmegaConf

from zoo.app.cli import RunFolders
from zoo.app.overrides import compose_defaults, is_group, split_override
from zoo.errors import USER_ERRORS, MachineFault, one_line, storage_failure, storage_message

EXIT_BAD_INPUT = 2
EXIT_FAULT = 3  # the machine failed the run (disk, a dead process): fix it and resume


def exit_status(error: BaseException) -> int:
    return EXIT_FAULT if isinstance(error, MachineFault) or storage_failure(error) is not None else EXIT_BAD_INPUT


def unwrap(error: BaseException) -> BaseException:
    """Hydra wraps errors raised inside `instantiate` (InstantiationException), OmegaConf those raised by a
    resolver (`${image_classes:...}`); the cause is what counts."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import InterpolationResolutionError

    while error.__cause__ is not None and isinstance(error, InstantiationException):
        error = error.__cause__
    # OmegaConf re-raises a resolver's error inside its own handler, once per nesting level: the user error is at
    # the end of that chain, by __cause__ or __context__ (a chain that ends in a bug keeps its outer error).
    inner = error
    while isinstance(inner, InterpolationResolutionError) and (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__
    return inner if inner is not error and isinstance(inner, user_error_types()) else error


def worker_error_text(text: str) -> str:
    """An error a DataLoader worker re-raised in the main process carries the worker's whole traceback
    ("Caught DataError in DataLoader worker process 0. Original Traceback ..."): its last line, the original
    message, is what counts."""
    if "in DataLoader worker process" not in text or "Original Traceback" not in text:
        return text
    last = [line for line in text.strip().splitlines() if line.strip()][-1]
    return re.sub(r"^[\w.]+: ", "", last.strip())


def closest(name: str, valid: list[str], what: str, limit: int = 80) -> str:
    """`did you mean 'max_epochs'?` for a near miss (difflib; two names when both are as near), else the valid
    names, cut to about `limit` characters: the whole message stays within about 200."""
    near = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    if near:
        score = lambda option: difflib.SequenceMatcher(None, name, option).ratio()
        near = [option for option in near if score(option) >= score(near[0]) - 0.05]
        return "did you mean " + " or ".join(repr(n) for n in near) + "?"
    shown, length = [], 0
    for option in valid:
        if shown and length + len(option) > limit:
            break
        shown.append(option)
        length += len(option) + 2
    rest = f", ... ({len(valid)} in all)" if len(shown) < len(valid) else ""
    return f"valid {what}: {', '.join(shown)}{rest}"


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
    parent, _, name = key.rpartition(".")
    keys = valid_keys(parent, args)
    where = f" in {parent}" if parent else ""
    valid = f"; {closest(name, [k for k in keys if not k.startswith('_')], f'keys{where}')}" if keys else ""
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
            valid = "; " + closest(match.group(1), [n for n, p in params.items() if p.kind in named], "options")
    return f"unknown option {match.group(1)!r} for {short_target(target) or 'this object'}{valid}"


def short_target(target: str | None) -> str | None:
    """`lightning.pytorch.trainer.trainer.Trainer` -> `lightning.Trainer` where the package exports it."""
    if target is None:
        return None
    parts = target.split(".")
    with contextlib.suppress(Exception):
        from hydra.utils import get_object

        if get_object(f"{parts[0]}.{parts[-1]}") is get_object(target):
            return f"{parts[0]}.{parts[-1]}"
    return target


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
    if isinstance(error, MachineFault):
        return one_line(str(error))
    if (failure := storage_failure(error)) is not None:
        return storage_message(failure)
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
    if type(error) in (ValueError, TypeError) and args and (typed := override_type_message(args)):
        return typed  # `seed=abc` fails deep in a library ("invalid literal for int()"): name the override
    if isinstance(error, user_error_types()):
        return one_line(worker_error_text(str(error))) or type(error).__name__
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

    types: list[type[BaseException]] = [*USER_ERRORS, MachineFault, pickle.UnpicklingError]
    if "lightning" in sys.modules:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        types.append(MisconfigurationException)
    return tuple(types)


USER_CHOICE = "ZOO_USER_HYDRA_FULL_ERROR"  # the user's own HYDRA_FULL_ERROR, while reporting_errors sets it to 1


def full_error_requested() -> bool:
    """Whether the user asked for full tracebacks (HYDRA_FULL_ERROR=1): inside `reporting_errors` (and in the rank
    processes Lightning starts with its environment) the choice it kept aside, elsewhere the variable itself."""
    return os.environ.get(USER_CHOICE, os.environ.get("HYDRA_FULL_ERROR")) == "1"


@contextlib.contextmanager
def reporting_errors(args: list[str], folders: RunFolders) -> Iterator[None]:
    """Around `zoo.app.run`: bad input -> `error: <one line>` on stderr and exit status 2; a run `folders`
    claimed that never started is taken away again.

    Hydra prints its own errors (unknown keys, bad override syntax) over several lines; with
    HYDRA_FULL_ERROR set inside, they reach this handler instead. A user's HYDRA_FULL_ERROR=1 still shows
    every traceback; bugs (errors that are not bad input) keep theirs either way. The processes Lightning starts
    for the other ranks inherit this environment: they read the user's own choice from USER_CHOICE.
    """
    previous = os.environ.get("HYDRA_FULL_ERROR")
    inherited = os.environ.get(USER_CHOICE)
    os.environ[USER_CHOICE] = "1" if full_error_requested() else "0"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Exception as error:
        if full_error_requested():
            raise
        message = user_error_message(error, args)
        if message is None:
            traceback.print_exc()
            sys.exit(1)
        folders.discard_refused(bad_input=exit_status(error) != EXIT_FAULT)  # a run that never started leaves nothing
        print(f"error: {message}", file=sys.stderr)
        sys.exit(exit_status(error))
    finally:
        for name, value in (("HYDRA_FULL_ERROR", previous), (USER_CHOICE, inherited)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
