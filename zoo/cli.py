"""What run.py does before and around Hydra: check the command line, plan a resume, report bad input in one line.

Kept free of torch and Lightning imports so that a mistyped option is answered in about a second.

- `prepare_arguments(args)`: rejects unknown config-group options (`model=foo`) before Hydra starts, and
  turns `auto_resume=<run dir>` / `ckpt_path=<run dir>/checkpoints/x.ckpt` into a run that continues in
  that directory with that run's own overrides.
- `reporting_errors()`: around Hydra's main; every bad input ends as `error: <one line>` and exit status 2
  (no traceback unless HYDRA_FULL_ERROR=1); bugs keep their traceback.
- `user_error_message(error)`: the one line for an error caused by bad input, None for a bug.
- The `fresh_dir` resolver (conf/hydra/default.yaml): a run directory no other run has claimed.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """A command line that cannot run as given; printed as one line."""


# ---------------------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------------------
def claim_run_dir(path: str) -> str:
    """Create `path` (or `path_1`, `path_2`, ... if taken) and return it: mkdir is atomic, so two runs
    started in the same second, even on different machines sharing a disk, never share a directory."""
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    for attempt in itertools.count():
        candidate = base if attempt == 0 else base.with_name(f"{base.name}_{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return str(candidate)
    raise AssertionError("unreachable")


# use_cache: one directory per config; Hydra copies the cache into every job of a sweep.
OmegaConf.register_new_resolver("fresh_dir", claim_run_dir, use_cache=True, replace=True)

# conf/hydra/launcher/{submitit_slurm,joblib}.yaml take the names of the plugins' structured configs on purpose
# (users type the names they know); Hydra then validates each file against that schema and warns that this
# matching is deprecated. The files list every field, so they also work once the matching is gone.
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/(submitit_slurm|joblib)' is validated against ConfigStore schema"
)


# ---------------------------------------------------------------------------------------------------------
# Command-line checks and resume planning
# ---------------------------------------------------------------------------------------------------------
def split_override(arg: str) -> tuple[str, str] | None:
    """`+model.net.dim=64` -> ("model.net.dim", "64"); None for flags and `~key` deletions."""
    if arg.startswith(("-", "~")) or "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    return key.lstrip("+"), value


def group_options(group: str, conf: Path = CONF) -> list[str]:
    folder = conf / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def is_group(key: str, conf: Path = CONF) -> bool:
    return not key.startswith("hydra") and (conf / key).is_dir()


def check_group_choices(args: list[str], conf: Path = CONF) -> None:
    """`model=foo` -> UsageError naming the valid models. Sweeps (`model=vit,gpt`) check every value;
    sweep functions (`choice(...)`, `glob(...)`) are left to Hydra."""
    for arg in args:
        parsed = split_override(arg)
        if parsed is None:
            continue
        key, value = parsed
        group = key.split("@", 1)[0]
        if not is_group(group, conf) or not re.fullmatch(r"[\w.\-/]+(,[\w.\-/]+)*", value):
            continue
        options = group_options(group, conf)
        for choice in value.split(","):
            if choice != "null" and choice not in options:
                raise UsageError(f"unknown {group} {choice!r}; valid choices: {', '.join(options) or '(none)'}")


def is_training(values: dict[str, str]) -> bool:
    return values.get("train", "true").lower() != "false" and values.get("mode", "train") == "train"


def run_dir_of_checkpoint(path: Path) -> Path | None:
    """<run>/checkpoints/x.ckpt -> <run> when <run> is a zoo run directory (has .hydra/)."""
    run_dir = path.expanduser().resolve().parent.parent
    if path.parent.name == "checkpoints" and (run_dir / ".hydra" / "overrides.yaml").is_file():
        return run_dir
    return None


def original_overrides(run_dir: Path) -> list[str]:
    """The overrides a run was started with (its .hydra/overrides.yaml), minus the resume bookkeeping."""
    overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    skip = ("auto_resume", "ckpt_path")
    return [str(o) for o in overrides if (split_override(str(o)) or ("", ""))[0] not in skip]


def prepare_arguments(args: list[str], conf: Path = CONF) -> list[str]:
    """Check the command line and plan a resume; returns the arguments Hydra should see.

    `auto_resume=<run dir>` (or `ckpt_path=<run dir>/checkpoints/<file>.ckpt` when training) continues
    that run: its original overrides come first (yours win), Hydra writes into that directory, and this
    launch's config goes to .hydra/resume_<time>/ so the original stays as it was.
    """
    check_group_choices(args, conf)
    values = dict(filter(None, map(split_override, args)))
    multirun = "-m" in args or "--multirun" in args
    auto_resume = values.get("auto_resume")
    run_dir = None
    if auto_resume is not None and auto_resume.lower() not in ("true", "false", "null"):
        run_dir = Path(auto_resume).expanduser()
        if not (run_dir / ".hydra" / "overrides.yaml").is_file():
            raise UsageError(
                f"auto_resume={auto_resume!r} is not a run directory (no .hydra/overrides.yaml in it); "
                "valid: a folder outputs/<model>/<date>_<time>/, true or false"
            )
        if multirun:
            raise UsageError(f"auto_resume={auto_resume!r} continues one run and cannot be combined with -m")
        args = [a if a != f"auto_resume={auto_resume}" else "auto_resume=true" for a in args]
    elif values.get("ckpt_path") not in (None, "null", "last") and is_training(values) and not multirun:
        run_dir = run_dir_of_checkpoint(Path(values["ckpt_path"]))
    if run_dir is None or "hydra.run.dir" in values:
        return args
    given = {key for key, _ in filter(None, map(split_override, args))}
    inherited = [o for o in original_overrides(run_dir) if (split_override(o) or (o, ""))[0] not in given]
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return [
        *inherited,
        *args,
        f"hydra.run.dir={run_dir.resolve()}",
        f"hydra.output_subdir=.hydra/resume_{stamp}",
    ]


# ---------------------------------------------------------------------------------------------------------
# One-line errors
# ---------------------------------------------------------------------------------------------------------
def one_line(text: str) -> str:
    return " ".join(text.split())


def unwrap(error: BaseException) -> BaseException:
    """Hydra wraps errors raised inside `instantiate` (InstantiationException); the cause is what counts."""
    from hydra.errors import InstantiationException

    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def compose_defaults(args: list[str]) -> Any:
    """The config these arguments select with every value at its default (only group choices applied;
    a sweep's first choice); None if it cannot be composed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    choices = []
    for arg in args:
        parsed = split_override(arg)
        if parsed and is_group(parsed[0].split("@", 1)[0]):
            choices.append(f"{arg.split('=', 1)[0]}={parsed[1].split(',')[0]}")
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=choices)
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()


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

    types: list[type[BaseException]] = [ValueError, FileNotFoundError, NotADirectoryError, pickle.UnpicklingError]
    if "lightning" in sys.modules:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        types.append(MisconfigurationException)
    if "zoo.callbacks" in sys.modules:
        from zoo.callbacks import NonFiniteLossError

        types.append(NonFiniteLossError)
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


def run_task(cfg: object) -> float | None:
    """The task function's body: the pipeline is imported here, so command-line mistakes are caught fast."""
    from zoo.pipeline import main

    return main(cfg)
