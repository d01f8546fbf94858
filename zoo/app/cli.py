"""What `zoo.app.run` does before Hydra starts: check the command line and plan a resume.

Kept free of torch and Lightning imports so that a mistyped option is answered in about a second.

- `prepare_arguments(args, folders)`: rejects unknown config-group options (`model=foo`) before Hydra starts,
  and turns `auto_resume=<run dir>` / `ckpt_path=<run dir>/checkpoints/x.ckpt` into a run that continues in
  that directory with that run's own overrides.
- `RunFolders`: what one run wrote before it started. Its `claim` is the `fresh_dir` resolver
  (conf/hydra/default.yaml): a run directory no other run has claimed; a run refused for bad input before it
  started takes its directory away again (`discard_refused`).
- `register_resolvers`: `image_classes` (conf/data/image_folder.yaml: num_classes counted from the class
  folders) and `shard_info` (conf/data/*_stream.yaml: num_classes, image size, channels of a shards folder).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from zoo.app.overrides import CONF, group_options, is_group, split_override
from zoo.errors import UsageError

# ---------------------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------------------
# What Hydra and the loggers write into a run directory before the first training step: a folder holding nothing
# more is a run that never started (a checkpoint, metrics.json or a mode's results mean it did).
HYDRA_ONLY = {".hydra", "run.log", "multirun.yaml"}  # multirun.yaml: a sweep directory before its first job
LOGGER_FOLDERS = {"tensorboard", "csv", "wandb", "lightning_logs"}
# Written by a run once it took a training step (zoo.app.pipeline.kept_once_trained): whatever ends the run then,
# its folder and what its loggers wrote are kept. A file, not a note in this process, so that every rank of a
# launch and a later resume see it; inside .hydra/, Hydra's own folder, so it adds nothing to the run's outputs.
STARTED = Path(".hydra") / "started"


def keep_run_folder(folder: str | Path) -> None:
    """Mark `folder` as a run that started (it trained): a later error keeps it and what its loggers wrote."""
    marker = Path(folder) / STARTED
    with contextlib.suppress(OSError):  # a full or read-only disk: the run's own fault report says so
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


@dataclass
class RunFolders:
    """What one `zoo.app.run` writes before its run starts, so that a run refused for bad input takes it away
    again: the run directories it created (`claim`, Hydra's `fresh_dir` resolver), the folders above them it had to
    create (innermost first), and what a resume wrote into an earlier run (its config folder; run.log's size
    before)."""

    claimed: list[Path] = field(default_factory=list)
    parents: list[Path] = field(default_factory=list)
    resume_writes: list[tuple[Path, Path, int]] = field(default_factory=list)

    def register(self) -> None:
        """Make this object the one `${fresh_dir:...}` (conf/hydra/default.yaml) claims directories for."""
        # use_cache: one directory per config; Hydra copies the cache into every job of a sweep.
        OmegaConf.register_new_resolver("fresh_dir", self.claim, use_cache=True, replace=True)

    def claim(self, path: str) -> str:
        """Create `path` (or `path_1`, `path_2`, ... if taken) and return it: mkdir is atomic, so two runs
        started in the same second, even on different machines sharing a disk, never share a directory."""
        base = Path(path)
        self.parents.extend(folder for folder in base.parents if not folder.exists())
        base.parent.mkdir(parents=True, exist_ok=True)
        for attempt in itertools.count():
            candidate = base if attempt == 0 else base.with_name(f"{base.name}_{attempt}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            self.claimed.append(candidate)
            return str(candidate)
        raise AssertionError("unreachable")

    def discard_unstarted(self, folder: str | Path | None = None, loggers_too: bool = True) -> bool:
        """Remove `folder` (default: the run directory claimed last) if claimed here, never started (no STARTED
        mark) and holding only Hydra's own files (and, with `loggers_too`, the loggers' folders, which Lightning
        creates as it sets up): a run refused for bad input before it started. True if removed; a directory with
        anything else in it is kept."""
        if not self.claimed:
            return False
        folder = Path(folder).resolve() if folder is not None else self.claimed[-1].resolve()
        if folder not in {claimed.resolve() for claimed in self.claimed} or (folder / STARTED).exists():
            return False
        unstarted = HYDRA_ONLY | (LOGGER_FOLDERS if loggers_too else set())
        if not folder.is_dir() or not {p.name for p in folder.iterdir()} <= unstarted:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        for parent in self.parents:  # the empty folders above it that this run created
            with contextlib.suppress(OSError):
                parent.rmdir()
        return not folder.exists()

    def discard_resume_writes(self) -> None:
        """A resume refused for bad input writes nothing into the run it refuses: its config folder goes, run.log
        is cut back to what it held."""
        while self.resume_writes:
            config_dir, log_file, size = self.resume_writes.pop()
            shutil.rmtree(config_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                if log_file.is_file() and log_file.stat().st_size > size:
                    with log_file.open("r+b") as handle:
                        handle.truncate(size)

    def discard_refused(self, folder: str | Path | None = None, bad_input: bool = True) -> None:
        """After a run ended with one error line: bad input leaves nothing behind (the run folder it claimed, or
        what a resume wrote into its run); a fault of the machine keeps whatever the run had begun."""
        if bad_input:
            self.discard_resume_writes()
        self.discard_unstarted(folder, loggers_too=bad_input)


def count_image_classes(data_dir: str) -> int:
    """`${image_classes:<folder>}` (conf/data/image_folder.yaml): the number of class folders, so the model's
    num_classes comes from the data; a missing or empty folder, or a class without images, is one DataError."""
    from zoo.data.images import image_folder_classes  # only for data=image_folder: torch loads when it resolves

    return len(image_folder_classes(data_dir))


def shard_info(data_dir: str, key: str) -> object:
    """`${shard_info:<shards folder>,<key>}` (conf/data/*_stream.yaml): what the model reads from a shards folder's
    zoo.json (num_classes, image_size, in_channels); a folder that is not one is one DataError."""
    from zoo.data.shards import shard_info as read  # only for the stream configs: torch loads when it resolves

    return read(data_dir, key)


def register_resolvers() -> None:
    """The resolvers conf/ uses (zoo.app.setup calls this): image_classes and shard_info, and a fresh_dir that
    claims directories for nobody in particular (compose without a run); `zoo.app.run` binds fresh_dir to its
    own RunFolders."""
    OmegaConf.register_new_resolver("image_classes", count_image_classes, replace=True)
    OmegaConf.register_new_resolver("shard_info", shard_info, replace=True)
    if not OmegaConf.has_resolver("fresh_dir"):
        RunFolders().register()


# ---------------------------------------------------------------------------------------------------------
# Command-line checks and resume planning
# ---------------------------------------------------------------------------------------------------------
def check_group_choices(args: list[str], conf: Path = CONF) -> None:
    """`model=foo` (or `model=null`) -> UsageError naming the valid models. Sweeps (`model=vit,gpt`) check every value;
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
            if choice == "null":
                raise UsageError(null_group_message(group, options))
            if choice not in options:
                raise UsageError(f"unknown {group} {choice!r}; valid choices: {', '.join(options) or '(none)'}")


def null_group_message(group: str, options: list[str]) -> str:
    """`attention=null`: Hydra takes no null for a config group (its parser fails without naming the key); the
    RNN's fixed-vector baseline is a key of its net, and any other group is left out with ~group."""
    if group == "attention":
        return (
            "attention=null is not an attention option; the RNN without attention (one fixed vector) is "
            f"model=rnn_translation model.net.attention=null; valid choices: {', '.join(options)}"
        )
    choices = ", ".join(options)
    return f"{group}=null is not a {group} option; leave the group out with ~{group}, or pick one of: {choices}"


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


def prepare_arguments(args: list[str], folders: RunFolders, conf: Path = CONF) -> list[str]:
    """Check the command line and plan a resume; returns the arguments Hydra should see.

    `auto_resume=<run dir>` (or `ckpt_path=<run dir>/checkpoints/<file>.ckpt` when training) continues
    that run: its original overrides come first (yours win), Hydra writes into that directory, and this
    launch's config goes to .hydra/resume_<time>/ so the original stays as it was (noted in `folders`, so that
    a refused resume takes it away again).
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
    log_file = run_dir.resolve() / "run.log"
    size = log_file.stat().st_size if log_file.is_file() else 0
    folders.resume_writes.append((run_dir.resolve() / ".hydra" / f"resume_{stamp}", log_file, size))
    return [
        *inherited,
        *args,
        f"hydra.run.dir={run_dir.resolve()}",
        f"hydra.output_subdir=.hydra/resume_{stamp}",
    ]
