"""Every `python run.py ...` command in README.md and in the docs/ pages runs as written, in one-batch form.

Commands are read from the code blocks and inline code of README.md and of every docs/**/*.md page (a page added
later is read as well), each distinct command once. Placeholders (`<multi30k folder>`, the
example run directory) are filled with tiny generated data and a run made here; commands that need
hardware this machine lacks (a GPU, several nodes, SLURM) are composed (`--cfg job`) instead of run. A
command shown with an `error:` line below it must end with exactly that line and exit status 2.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    ROOT,
    as_checkpoint,
    compose_config,
    run_cli,
    run_in_process,
    tiny_data_overrides,
    tiny_datasets,
    tiny_model,
)

README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLE_RUN = "outputs/vit/2025-01-31_12-00-00"  # the README's example of a run directory
HARDWARE = {
    "trainer=gpu": "a GPU",
    "trainer=ddp": "GPUs",
    "trainer=fsdp": "GPUs",
    "trainer=multinode": "several nodes",
    "hydra/launcher=submitit_slurm": "SLURM",
}


# Commands known to fail, with the issue that fixes them (strict: the test fails once they work, so the
# entry is removed then).
KNOWN_BROKEN: dict[str, str] = {}


@dataclass
class Command:
    line: str  # as the page writes it
    args: list[str]  # the arguments of run.py
    launcher: str  # what starts run.py: "python", "srun", "torchrun"
    shown_error: str | None = None  # the `error:` line the page shows below it
    page: str = "README.md"  # the first page that shows it
    env: dict[str, str] = field(default_factory=dict)  # leading `NAME=value` words: its environment variables

    @property
    def needs(self) -> str | None:
        if self.launcher != "python":
            return f"{self.launcher} (a cluster launcher)"
        if self.needs_gpu():
            return "a GPU"
        return next((what for arg, what in HARDWARE.items() if arg in self.args), None)

    def needs_gpu(self) -> bool:
        return not torch.cuda.is_available() and any(a in self.args for a in ("trainer.accelerator=gpu",))


def strip_comment(line: str) -> str:
    """The command without a trailing `# comment` (a # inside quotes stays)."""
    quote = None
    for i, char in enumerate(line):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


ENVIRONMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # `ZOO_FAST_KERNELS=0 python run.py ...`


def parse(text: str, shown_error: str | None = None) -> Command | None:
    words = shlex.split(text)
    if "run.py" not in words:
        return None
    env = {}
    while ENVIRONMENT.match(words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    at = words.index("run.py")
    launcher = "python" if words[:at] == ["python"] else words[0]
    return Command(text, words[at + 1 :], launcher, shown_error, env=env)


def code_blocks(page: str) -> list[list[str]]:
    """The lines of a page's code blocks (fenced or indented by 4 spaces), backslash continuations joined."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", page, re.M | re.S)
    blocks += ["\n".join(line[4:] for line in b.splitlines()) for b in re.findall(r"(?:^ {4}\S.*\n)+", page, re.M)]
    joined_blocks = []
    for block in blocks:
        joined: list[str] = []
        for line in block.splitlines():
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        joined_blocks.append(joined)
    return joined_blocks


def readme_commands(readme: str) -> list[Command]:
    commands: list[Command] = []
    for joined in code_blocks(readme):
        for i, line in enumerate(joined):
            shown = line.startswith("$ ")
            line = strip_comment(line[2:] if shown else line.strip())
            after = joined[i + 1] if i + 1 < len(joined) else ""
            error = after.strip() if shown and after.startswith("error:") else None
            if "run.py" in line.split():
                command = parse(line, error)
                if command is not None:
                    commands.append(command)
    for span in re.findall(
        r"(?<!`)`((?:[A-Z_][A-Z0-9_]*=\S* )*(?:srun |torchrun [^`]*?)?python run\.py[^`]*|torchrun [^`]*run\.py[^`]*)`",
        readme,
    ):
        command = parse(" ".join(span.split()))
        if command is not None:
            commands.append(command)
    return commands


def pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_commands(paths: list[Path]) -> list[Command]:
    """The run.py commands of these pages, each distinct one once (at the first page that shows it)."""
    found: dict[tuple, Command] = {}
    for path in paths:
        for command in readme_commands(path.read_text()):
            command.page = str(path.relative_to(ROOT))
            key = (command.launcher, tuple(command.args), command.shown_error, tuple(sorted(command.env.items())))
            found.setdefault(key, command)
    return list(found.values())


COMMANDS = page_commands(pages())


def test_the_readme_has_the_commands_this_test_reads() -> None:
    assert "python run.py model=vit" in {command.line for command in readme_commands(README.read_text())}
    for page in ("getting-started.md", "using-a-trained-model.md", "scaling-up.md", "troubleshooting.md"):
        assert readme_commands((DOCS / page).read_text()), f"no run.py command read from docs/{page}"
    assert {c.page for c in COMMANDS} >= {"README.md", "docs/using-a-trained-model.md", "docs/scaling-up.md"}
    assert any(c.args[:1] == ["-m"] for c in COMMANDS) and any(c.shown_error for c in COMMANDS)
    assert any(c.launcher == "torchrun" for c in COMMANDS) and any(c.launcher == "srun" for c in COMMANDS)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, trained_runs) -> dict:
    """Tiny data, a finished one-epoch ViT run standing in for the README's example run directory (a copy of the
    session's trained example run, tests/conftest.py), and a stand-in checkpoint of every other family (random
    weights) for `<... checkpoint>`."""
    root = tmp_path_factory.mktemp("readme")
    data = tiny_datasets(root / "data")
    run = trained_runs["vit_example"].copy_to(root / "outputs" / "vit" / "2025-01-31_12-00-00")
    # The run wrote a test image of each of the 10 classes; three still make `inputs=<images>` a folder of
    # several, and every command reading it (predict, attention maps, explain) draws a figure per image.
    for image in sorted((run / "examples").iterdir())[3:]:
        image.unlink()
    checkpoints = {
        family: as_checkpoint(tiny_model(family), root / f"{family}.ckpt")
        for family in ("gpt", "translation", "rnn_translation", "clip", "sequence_classifier")
    }
    checkpoints["llama"] = checkpoints["gpt"]  # the Llama preset is the GPT family
    return {"root": root, "data": data, "run": run, "checkpoints": checkpoints}


def substitute(command: Command, world: dict, tmp_path: Path | None = None) -> list[str]:
    """The command's arguments with README placeholders filled in: tiny data and the example run; files the
    command would write in the repository go to the test's folder instead."""
    data, root = world["data"], world["root"]
    placeholders = {
        "<tinyshakespeare input.txt>": str(data["text"]),
        "<multi30k folder>": str(data["multi30k"]),
        "/usr/share/datasets/fashion-mnist": str(data["fashion_mnist"]),
        EXAMPLE_RUN: str(world["run"]),
        "outputs/vit/job-1234": str(root / "outputs" / "vit" / "job-1234"),
        "sqlite:///optuna-gpt.db": f"sqlite:///{root / 'optuna-gpt.db'}",
        **stand_ins(world),
        **(hf_datasets(root) if "<hf " in command.line else {}),  # only these commands need `datasets`
    }
    line = shard_placeholders(command.line, world, tmp_path or root)
    for placeholder, value in placeholders.items():
        line = line.replace(placeholder, value)
    args = parse(line).args
    unfilled = [arg for arg in args if re.search(r"<[^>]*>", arg)]
    assert not unfilled, f"placeholder without a stand-in in tests/test_readme.py: {unfilled}"
    return args


def huggingface_folder(folder: Path, corpus: Path) -> Path:
    """A tiny random Llama `save_pretrained` folder with its tokenizer.json (made once)."""
    from tests.app.test_pretrained_decoder import pretrained_folder

    return folder if (folder / "config.json").is_file() else pretrained_folder(folder, corpus)


def hf_datasets(root: Path) -> dict[str, str]:
    """`<hf ... dataset folder>`: tiny Hugging Face datasets saved with save_to_disk (made once)."""
    from tests.data import test_huggingface as hf

    builders = {"text": hf.text_dataset, "image": hf.image_dataset, "caption": hf.caption_dataset,
                "parallel": hf.parallel_dataset, "sequence": hf.sequence_dataset}  # fmt: skip
    folders = {}
    for kind, build in builders.items():
        folder = root / f"hf-{kind}"
        if not folder.exists():
            build(folder)
        folders[f"<hf {kind} dataset folder>"] = str(folder)
    return folders


# Shards stand-ins (docs/data-at-scale.md): the data each conversion command of the page reads, made tiny.
SHARDS = {
    "<image shards>": ["model=vit", "data=fashion_mnist"],
    "<caption shards>": ["model=clip", "data=digits_captions"],
    "<text shards>": ["model=gpt", "data=shakespeare"],
    "<parallel text shards>": ["model=translation", "data=multi30k"],
    "<sequence shards>": ["model=sequence_classifier", "data=listops", "data.max_length=256"],
}


def shards_stand_in(placeholder: str, world: dict) -> Path:
    """The tiny data of a `<... shards>` placeholder converted once into a shards folder under the world's root."""
    import hydra

    from zoo.data.shards import write_shards

    folder = world["root"] / "shards" / placeholder.strip("<>").replace(" ", "-")
    if not (folder / "zoo.json").is_file():
        choices = SHARDS[placeholder]
        cfg = compose_config(choices, world["root"])
        cfg = compose_config([*choices, *tiny_data_overrides(cfg, world["data"])], world["root"])
        # small chunks: litdata deals whole chunks to ranks, and 2 ranks of tiny data need 2 chunks at least
        write_shards(hydra.utils.instantiate(cfg.data, _convert_="all"), folder, chunk_bytes="4KB")
    return folder


def shard_placeholders(line: str, world: dict, tmp_path: Path) -> str:
    """A conversion command (mode=shard) writes into a new folder; any other command reads prebuilt shards."""
    for placeholder in SHARDS:
        if placeholder in line:
            new = tmp_path / "new-shards" / placeholder.strip("<>").replace(" ", "-")
            folder = new if "mode=shard" in line.split() else shards_stand_in(placeholder, world)
            line = line.replace(placeholder, str(folder))
    return line


def stand_ins(world: dict) -> dict[str, str]:
    """Placeholders of "Using a trained model": the example run's checkpoint and images, the other families'
    stand-in checkpoints."""
    examples = world["run"] / "examples"
    return {
        "<vit checkpoint>": str(world["run"] / "checkpoints" / "last.ckpt"),
        **{f"<{family} checkpoint>": str(path) for family, path in world["checkpoints"].items()},
        "<images>": str(examples),
        "<text file>": str(world["data"]["text"]),
        "<Hugging Face folder>": str(huggingface_folder(world["root"] / "hf-llama", world["data"]["text"])),
        "<image>": str(sorted(examples.iterdir())[0]),
    }


def one_batch(args: list[str], world: dict, tmp_path: Path) -> list[str]:
    """The command in one-batch form, writing under tmp_path, its data pointed at tiny files."""
    values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    sweep = "-m" in args or any(key.startswith("hparams_search") for key in values)
    extra = ["trainer.fast_dev_run=true", "print_config=false"]
    if sweep:
        extra.append(f"hydra.sweep.dir={tmp_path / 'sweep'}")
        args = [first_two(a) for a in args]
        args = [a for a in args if not a.startswith("hydra.sweeper.n_trials=")] + ["hydra.sweeper.n_trials=2"] * (
            any(k.startswith("hparams_search") for k in values)
        )
    elif "hydra.run.dir" not in values and "auto_resume" not in values and not resumes(values):
        extra.append(f"hydra.run.dir={tmp_path / 'run'}")
    choices = [a for a in args if a.split("=", 1)[0].lstrip("+") in ("model", "data", "experiment", "hparams_search")]
    cfg = compose_config([c.split(",")[0] for c in choices], tmp_path)
    given = {a.split("=", 1)[0] for a in args}
    data = [o for o in tiny_data_overrides(cfg, world["data"]) if o.split("=", 1)[0] not in given]
    if "cache_dir" in cfg.data and "data.cache_dir" not in given:  # a corpus is tokenised once for all commands
        data.append(f"data.cache_dir={world['root'] / 'token_cache'}")
    return [*args, *data, *extra, f"paths.data_dir={tmp_path / 'data'}"]


def first_two(arg: str) -> str:
    """A grid sweep's `key=a,b,c,d` cut to its first two values: two jobs still sweep (and run in parallel under
    joblib), as an Optuna search's one-batch form runs two trials. Values with brackets, braces, parentheses or
    quotes (lists, dicts, sweeper functions) stay whole."""
    key, sep, value = arg.partition("=")
    if not sep or value.count(",") < 2 or any(c in value for c in "[]{}()'\""):
        return arg
    return f"{key}={','.join(value.split(',')[:2])}"


def resumes(values: dict[str, str]) -> bool:
    """A training command with ckpt_path= continues in that run's directory; other modes get their own."""
    return "ckpt_path" in values and values.get("mode", "train") == "train"


def marks(command: Command) -> list:
    return [pytest.mark.xfail(reason=why, strict=True) for key, why in KNOWN_BROKEN.items() if key in command.line]


@pytest.mark.parametrize("command", [pytest.param(c, id=f"{c.page}: {c.line[:90]}", marks=marks(c)) for c in COMMANDS])
def test_readme_command_works_as_written(command: Command, world, tmp_path, capsys) -> None:
    args = substitute(command, world, tmp_path)
    if command.shown_error:
        code, out, err = run_in_process([*args, "print_config=false"], capsys)
        assert code == 2 and err.strip() == command.shown_error, err[-2000:]
        return
    if command.needs:  # compose what would run there (a sweep's first job), as far as this machine can tell
        first_job = [a.split(",")[0] if "=" in a and "[" not in a else a for a in args if a not in ("-m", "--multirun")]
        code, out, err = run_in_process([*first_job, "--cfg", "job"], capsys)
        assert code == 0, f"needs {command.needs}; does not even compose: {(out + err)[-3000:]}"
        assert "model:" in out
        return
    args = one_batch(args, world, tmp_path)
    # Lightning starts DDP's other ranks as new processes; environment variables are read when zoo is imported
    if command.env or any(a.startswith("trainer=ddp") for a in args):
        result = run_cli(args, timeout=300, env={"WANDB_MODE": "offline", **command.env})
        code, out, err = result.returncode, result.stdout, result.stderr
    else:
        code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-4000:]


def python_examples(page: str) -> list[str]:
    """The ```python blocks of a page."""
    return re.findall(r"^```python\n(.*?)^```", page, re.M | re.S)


def test_the_notebook_examples_of_using_a_trained_model_run(world) -> None:
    examples = python_examples((DOCS / "using-a-trained-model.md").read_text())
    assert [block.splitlines()[0].rsplit("# ", 1)[-1] for block in examples] == [
        "ViT",
        "GPT",
        "translation",
        "CLIP",
        "sequence classifier (ListOps)",
    ]
    for block in examples:
        assert len([line for line in block.splitlines() if line.strip()]) <= 5, block
        for placeholder, value in {EXAMPLE_RUN: str(world["run"]), **stand_ins(world)}.items():
            block = block.replace(placeholder, value)
        assert not re.search(r"<[^>]*>", block), f"placeholder without a stand-in: {block}"
        exec(compile(block, "docs/using-a-trained-model.md", "exec"), {})


def test_no_command_of_the_pages_reads_the_shared_data_folder() -> None:
    """The pages' commands run here without ../shared (a fresh machine, CI): data a command needs is named by a
    placeholder (`<multi30k folder>`) that this file fills with tiny generated data."""
    shared = [f"{command.page}: {command.line}" for command in COMMANDS if "../shared" in command.line]
    assert not shared, f"commands reading ../shared (use a placeholder such as <multi30k folder>): {shared}"
