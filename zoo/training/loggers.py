"""Logging that works with every logger: media (images, text tables), gradient norms, W&B setup.

Tasks call `log_image` / `log_text_table` (with themselves, a Trainer, or a plain list of loggers as the
owner) without knowing which loggers are configured: W&B gets
`wandb.Image` / `wandb.Table`, TensorBoard gets `add_image` / a markdown table, CSV (and anything else)
ignores media. Only global rank 0 logs. `heatmap_figure` and `confusion_matrix_figure` draw the
matrices tasks log (attention maps, confusion matrices, CLIP image-text similarities).
"""

from __future__ import annotations

import csv
import netrc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from zoo.errors import ZooWarning

WANDB_HOST = "api.wandb.ai"


# -- media ----------------------------------------------------------------------------------------
def _trainer(owner: L.LightningModule | L.Trainer) -> L.Trainer | None:
    if isinstance(owner, L.Trainer):
        return owner
    return owner._trainer  # None when the module is not attached to a Trainer (e.g. in a notebook)


def _media_loggers(owner: L.LightningModule | L.Trainer | Sequence[Logger]) -> tuple[L.Trainer | None, list[Logger]]:
    if isinstance(owner, (list, tuple)):  # loggers of a run without a Trainer (inference modes of run.py)
        return None, list(owner)
    trainer = _trainer(owner)
    if trainer is None or not trainer.is_global_zero or trainer.sanity_checking:
        return trainer, []
    return trainer, list(trainer.loggers)


def wants_media(owner: L.LightningModule | L.Trainer) -> bool:
    """Whether `log_image` / `log_text_table` would log anywhere here (a W&B or TensorBoard logger, on rank 0):
    check it before drawing something expensive."""
    return any(isinstance(logger, (WandbLogger, TensorBoardLogger)) for logger in _media_loggers(owner)[1])


def figure_to_array(figure: Any) -> np.ndarray:
    """A matplotlib Figure rendered to an RGB uint8 array (H, W, 3); the figure is closed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    close_figure(figure)
    return image


def close_figure(figure: Any) -> None:
    """Release a figure made with pyplot (figures built with matplotlib.figure.Figure need nothing)."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(figure)


def to_image_array(image: Any) -> np.ndarray:
    """Figure, tensor or array -> (H, W, C) uint8 with C in {1, 3}. Floats are read as [0, 1];
    channel-first (C, H, W) input with C in {1, 3} is transposed."""
    if hasattr(image, "savefig"):
        return figure_to_array(image)
    array = image.detach().float().cpu().numpy() if torch.is_tensor(image) else np.asarray(image)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3:
        raise ValueError(f"an image must be (H, W), (H, W, C) or (C, H, W), got shape {array.shape}")
    if array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.shape[-1] not in (1, 3):
        raise ValueError(f"an image needs 1 or 3 channels, got shape {array.shape}")
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float64), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    return array


def save_png(array: np.ndarray, path: str | Path) -> None:
    """An (H, W, C) uint8 image (as `to_image_array` returns) written as a PNG; folders are created."""
    from matplotlib.image import imsave

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    imsave(path, array[..., 0] if array.shape[-1] == 1 else array, cmap="gray", format="png")


def log_image(
    owner: L.LightningModule | L.Trainer,
    key: str,
    image: Any,
    caption: str | None = None,
    step: int | None = None,
    save_path: str | Path | None = None,
) -> None:
    """Log one image (matplotlib Figure, (H, W[, C]) / (C, H, W) array or tensor) to every logger that shows
    images; with `save_path` also write it there as a PNG (on rank 0, whichever loggers the run has).
    A Figure is closed after rendering, also when nobody wants it."""
    trainer, loggers = _media_loggers(owner)
    save = save_path is not None and (trainer is None or trainer.is_global_zero)
    if not save and not wants_media(owner):
        if hasattr(image, "savefig"):
            close_figure(image)
        return
    array = to_image_array(image)
    if save:
        save_png(array, save_path)
    step = trainer.global_step if step is None and trainer is not None else step
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[array], step=step, **({"caption": [caption]} if caption else {}))
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, array, global_step=step, dataformats="HWC")


def log_text_table(
    owner: L.LightningModule | L.Trainer,
    key: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    step: int | None = None,
) -> None:
    """Log a table of text (e.g. prompt | sample, source | reference | translation) to every logger that
    shows tables: a W&B Table, or a markdown table in TensorBoard's text tab."""
    columns = [str(column) for column in columns]
    rows = [[str(cell) for cell in row] for row in rows]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table {key!r} has {len(columns)} columns {columns}, but a row has {len(row)} cells")
    trainer, loggers = _media_loggers(owner)
    step = trainer.global_step if step is None and trainer is not None else step
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_table(key=key, columns=columns, data=rows, step=step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, markdown_table(columns, rows), global_step=step)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns and rows as a markdown table (pipes escaped, newlines as <br>)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class _ContinuingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that a metrics.csv already in its folder (a resumed run's) is continued: its
    rows and columns are kept and the new rows follow them. Lightning's own deletes the file as it starts, so a
    resumed run lost every row logged before the resume."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = list(csv.DictReader(file).fieldnames or [])


class ContinuingCSVLogger(CSVLogger):
    """CSVLogger (logger=csv) whose metrics.csv survives a resume (auto_resume, ckpt_path into the same run):
    the rows before the resume stay, the resumed run's are appended; a new column rewrites the header only."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(log_dir=self.log_dir)
        return self._experiment


def tick_label(label: Any) -> str:
    """A token as a tick label: characters with no glyph (newlines, control characters of a char tokenizer) as
    their escapes, so the label shows what the token is instead of an empty box."""
    text = str(label)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def heatmap_figure(
    matrix: Any,
    row_labels: Sequence[str] | None = None,
    column_labels: Sequence[str] | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    annotate: bool = False,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> Any:
    """A labelled heatmap of a 2-D matrix (attention map, image-text similarity, confusion matrix)."""
    from matplotlib.figure import Figure

    values = matrix.detach().float().cpu().numpy() if torch.is_tensor(matrix) else np.asarray(matrix, dtype=float)
    if values.ndim != 2:
        raise ValueError(f"heatmap_figure needs a 2-D matrix, got shape {values.shape}")
    rows, cols = values.shape
    size = (min(12.0, 2.0 + 0.45 * cols), min(12.0, 1.5 + 0.45 * rows))
    figure = Figure(figsize=size, dpi=100)
    axes = figure.subplots()
    shown = axes.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    figure.colorbar(shown, ax=axes, fraction=0.046, pad=0.04)
    if column_labels is not None:
        axes.set_xticks(range(cols), [tick_label(label) for label in column_labels], rotation=45, ha="right")
    if row_labels is not None:
        axes.set_yticks(range(rows), [tick_label(label) for label in row_labels])
    if annotate:
        number = "{:.0f}" if np.all(values == np.round(values)) else "{:.2f}"
        for i in range(rows):
            for j in range(cols):
                red, green, blue, _ = shown.cmap(shown.norm(values[i, j]))
                light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5  # dark text on light cells
                axes.text(
                    j,
                    i,
                    number.format(values[i, j]),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if light else "white",
                )
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    figure.tight_layout()
    return figure


def confusion_matrix_figure(confusion: Any, class_names: Sequence[str] | None = None, normalize: bool = True) -> Any:
    """Rows: true class, columns: predicted class; normalised per true class (recall on the diagonal)."""
    counts = confusion.detach().cpu().double().numpy() if torch.is_tensor(confusion) else np.asarray(confusion, float)
    values = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0) if normalize else counts
    labels = list(class_names) if class_names else [str(i) for i in range(len(counts))]
    return heatmap_figure(
        values,
        labels,
        labels,
        title="confusion matrix" + (" (row-normalised)" if normalize else ""),
        xlabel="predicted",
        ylabel="true",
        annotate=len(labels) <= 20,
        cmap="Blues",
        vmin=0.0,
        vmax=1.0 if normalize else None,
    )


# -- gradient norms -------------------------------------------------------------------------------
class GradientNormMonitor(L.Callback):
    """Logs the L2 norm of all gradients (`grad_norm/total`), before clipping, on the steps the loggers write;
    with `group_depth` > 0 also one norm per module group, e.g. depth 3: `grad_norm/net.blocks.0`.

    A growing or spiking total norm is the usual first sign of a too-high learning rate."""

    def __init__(self, group_depth: int = 0, norm_type: float = 2.0) -> None:
        if group_depth < 0:
            raise ValueError(f"group_depth must be >= 0, got {group_depth}")
        self.group_depth = group_depth
        self.norm_type = float(norm_type)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        # Lightning's own rule for when step values reach the loggers: computed on other steps they would be
        # held back and written later under the wrong step.
        if not trainer._logger_connector.should_update_logs:
            return
        groups: dict[str, list[torch.Tensor]] = {}
        for name, parameter in pl_module.named_parameters():
            if parameter.grad is None:
                continue
            group = ".".join(name.split(".")[: self.group_depth]) if self.group_depth else "total"
            groups.setdefault(group, []).append(parameter.grad.detach().float().norm(self.norm_type))
        if not groups:
            return
        # Sum of p-th powers per group, then one reduction: under FSDP each rank holds a shard of the gradients.
        powers = {group: torch.stack(norms).pow(self.norm_type).sum() for group, norms in groups.items()}
        if type(trainer.strategy).__name__.startswith("FSDP"):
            powers = {group: trainer.strategy.reduce(value, reduce_op="sum") for group, value in powers.items()}
        total = torch.stack(list(powers.values())).sum().pow(1.0 / self.norm_type)
        logged = {"grad_norm/total": total}
        if self.group_depth:
            logged.update({f"grad_norm/{group}": value.pow(1.0 / self.norm_type) for group, value in powers.items()})
        pl_module.log_dict(logged, on_step=True, on_epoch=False, batch_size=1)


# -- Weights & Biases -----------------------------------------------------------------------------
def wandb_api_key_available(environ: dict[str, str] | None = None) -> bool:
    """True when W&B could authenticate: WANDB_API_KEY is set, or `wandb login` stored a key in ~/.netrc.
    Only the presence of a key is checked; its value is never read into zoo's logs or configs."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY"):
        return True
    try:
        host = environ.get("WANDB_BASE_URL", f"https://{WANDB_HOST}").split("://")[-1].split("/")[0]
        return netrc.netrc(environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(environ: dict[str, str] | None = None) -> str:
    """online | offline | disabled: WANDB_MODE wins; without it, offline unless an API key is available."""
    environ = os.environ if environ is None else environ
    mode = environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("offline", "dryrun"):
        return "offline"
    if mode == "disabled":
        return "disabled"
    return "online" if wandb_api_key_available(environ) else "offline"


class ZooWandbLogger(WandbLogger):
    """Lightning's WandbLogger; with `log_model=True`, at the end of a successful fit, the best checkpoint (by the
    monitored metric) becomes a `model` artifact with alias `best`, and last.ckpt one with alias `last`, also
    offline (`wandb sync` uploads them). `log_model="all"` is Lightning's own: every checkpoint, online only."""

    def __init__(self, *args: Any, log_model: bool | str = False, **kwargs: Any) -> None:
        self.checkpoint_artifacts = log_model is True
        super().__init__(*args, log_model="all" if log_model == "all" else False, **kwargs)
        self._model_checkpoints: list[ModelCheckpoint] = []
        self._logged_artifacts: set[tuple[str, str]] = set()  # finalize runs after fit and again after test

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        if self.checkpoint_artifacts and checkpoint_callback not in self._model_checkpoints:
            self._model_checkpoints.append(checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if status != "success" or not self._model_checkpoints:
            return
        import wandb

        for callback in self._model_checkpoints:
            # a monitored ModelCheckpoint keeps the best; the one without a monitor keeps last.ckpt
            path, alias = (callback.best_model_path, "best") if callback.monitor else (callback.last_model_path, "last")
            path = path or callback.best_model_path
            if not path or (path, alias) in self._logged_artifacts or not Path(path).is_file():
                continue
            self._logged_artifacts.add((path, alias))
            score = callback.best_model_score if callback.monitor else None
            metadata = {"monitor": callback.monitor, "mode": callback.mode, "file": Path(path).name}
            metadata["score"] = None if score is None else float(score)
            artifact = wandb.Artifact(name=f"model-{self.experiment.id}", type="model", metadata=metadata)
            artifact.add_file(path, name="model.ckpt")
            self.experiment.log_artifact(artifact, aliases=[alias])


def sweep_group(group: str | None, sweep_name: str | None) -> str | None:
    """The W&B group of a sweep's runs (and of its summary run): `<group>/<sweep>`."""
    return f"{group}/{sweep_name}" if group and sweep_name else group


def wandb_logger(
    save_dir: str,
    project: str = "zoo",
    name: str | None = None,
    group: str | None = None,
    tags: Sequence[str] | None = None,
    log_model: bool | str = False,
    offline: bool | None = None,
    **kwargs: Any,
) -> ZooWandbLogger:
    """A W&B logger set up from zoo's config (conf/logger/wandb.yaml).

    - offline when WANDB_MODE=offline, when `offline=true`, or when no API key is found; then nothing
      touches the network and the run can be uploaded later with `wandb sync`.
    - name: conf/logger/wandb.yaml makes it `<model>/<attention>/<data>`; null: the run directory's name. In a
      sweep the job is appended (`.../<job>`), the group gets the sweep's name (`<group>/<sweep>`) and the
      tags `sweep:<sweep>`, so a sweep's runs group together and can be filtered.
    """
    mode = wandb_mode()
    offline = mode != "online" if offline is None else offline
    if mode == "disabled":
        os.environ["WANDB_MODE"] = "disabled"
    run_dir = Path(save_dir)
    sweep_name = _sweep_name()
    if sweep_name:
        name = f"{name}/{run_dir.name}" if name else f"{sweep_name}/{run_dir.name}"
        tags = [*(tags or []), f"sweep:{sweep_name}"]
    name = name or run_dir.name
    group = sweep_group(group, sweep_name)
    if offline and log_model == "all":
        rank_zero_warn(
            "W&B offline: only the best and last checkpoints become artifacts (log_model=all needs the network)",
            category=ZooWarning,
        )
        log_model = True
    if offline and mode != "disabled":
        reason = "WANDB_MODE=offline" if os.environ.get("WANDB_MODE") else "no W&B API key found"
        rank_zero_info(
            f"W&B: {reason}, logging offline to {run_dir / 'wandb'}. Upload later with:\n"
            f"  wandb login && wandb sync {run_dir / 'wandb'}/offline-run-*"
        )
    return ZooWandbLogger(
        name=name,
        save_dir=str(run_dir),
        project=project,
        group=group,
        tags=list(tags or []),
        log_model=log_model,
        offline=offline,
        **kwargs,
    )


def _sweep_name() -> str | None:
    """`<date>_<time>` of the running Hydra sweep (its directory name), None outside a sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).name


# The config as W&B shows it: these groups as sections of their own, everything else under `run`.
CONFIG_SECTIONS = ("model", "attention", "data", "trainer", "callbacks")


def wandb_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved run config (not Hydra's settings) in readable sections: model, attention, data, trainer,
    callbacks, and `run` (mode, seed, tags, paths, loggers, ...). The attention config is its own section, so
    the model's copy of it (`model.net.attention`) is left out."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    resolved.pop("hydra", None)
    sections = {key: resolved.pop(key) for key in CONFIG_SECTIONS if key in resolved}
    net = (sections.get("model") or {}).get("net")
    if isinstance(net, dict) and "attention" in sections and net.get("attention") == sections["attention"]:
        net.pop("attention")
    sections["run"] = resolved
    return sections


def define_wandb_metrics(experiment: Any, cfg: DictConfig) -> None:
    """What W&B's charts and run table show without clicking: every metric against its own step axis (validation
    and test metrics against epochs when the model validates once an epoch, else against the global step), and
    the monitored metric's best value (min or max by model_metric.mode) as its summary, not the last one."""
    step = "trainer/global_step"
    trainer = cfg.get("trainer") or {}
    interval = trainer.get("val_check_interval")
    once_an_epoch = interval is None or (isinstance(interval, float) and interval == 1.0)  # 1.0: the whole epoch
    per_epoch = once_an_epoch and (trainer.get("max_epochs") or 0) > 0
    evaluation = "epoch" if per_epoch else step
    experiment.define_metric(step)
    experiment.define_metric("epoch", step_metric=step)
    for pattern, axis in (("train/*", step), ("lr-*", step), ("grad_norm/*", step), ("val/*", evaluation),
                          ("test/*", evaluation)):  # fmt: skip
        experiment.define_metric(pattern, step_metric=axis)
    metric = cfg.get("model_metric") or {}
    if metric.get("name"):
        summary = "max" if metric.get("mode") == "max" else "min"
        experiment.define_metric(str(metric["name"]), step_metric=evaluation, summary=summary)


def log_hydra_config(loggers: Sequence[Logger], cfg: DictConfig) -> None:
    """W&B: the resolved run config in sections (`wandb_config`) and the metric definitions (`define_wandb_metrics`)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_hyperparams(wandb_config(cfg))
            define_wandb_metrics(logger.experiment, cfg)


def log_sweep_summary(
    *,
    save_dir: str | Path,
    project: str | None,
    entity: str | None,
    group: str | None,
    name: str,
    tags: Sequence[str],
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    images: dict[str, Path],
    summary: dict[str, Any],
    config: dict[str, Any],
) -> None:
    """One W&B run standing for a whole sweep: its table (`sweep/summary`), its plots (`sweep/<name>`) and the
    best result in the run summary; offline without an API key, like every zoo run."""
    mode = wandb_mode()
    if mode == "disabled":
        return
    import wandb

    run = wandb.init(
        dir=str(save_dir),
        project=project,
        entity=entity,
        group=group,
        name=name,
        tags=list(tags),
        job_type="sweep",
        config=config,
        mode=mode,
        reinit="finish_previous",
    )
    try:
        logged: dict[str, Any] = {"sweep/summary": wandb.Table(columns=list(columns), data=[list(r) for r in rows])}
        logged.update({f"sweep/{key}": wandb.Image(str(path)) for key, path in images.items()})
        run.log(logged)
        run.summary.update(summary)
    finally:
        run.finish()
    if mode == "offline":
        rank_zero_info(f"W&B: the sweep's summary run is in {Path(save_dir) / 'wandb'}; upload it with wandb sync")
