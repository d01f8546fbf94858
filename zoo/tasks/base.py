"""The Lightning base every task shares: optimiser with weight-decay groups and lr schedule, the
checkpoint's identity (task and model family) and tokenizer, torch.compile, LoRA fine-tuning (model.lora)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy

from zoo.data.tokenizers import tokenizer_from_string, tokenizer_to_string
from zoo.errors import AttentionPlacement, CheckpointError
from zoo.nn.lora import LoRAConfig, add_lora
from zoo.tasks.optim import build_optimizer, lr_multiplier
from zoo.training.checkpoints import ADAPTERS_ONLY, check_weights
from zoo.weights import checkpoint_identity, identity

log = logging.getLogger("zoo")


class ZooTask(L.LightningModule):
    """Holds `self.net` (a pure nn.Module from zoo.models) and owns optimisation.

    optimizer: {name, lr, weight_decay, betas, eps}; scheduler: {name, warmup_steps | warmup_ratio,
    min_lr}. Total steps come from the Trainer (max_steps, or epochs x batches).

    lora: zoo.nn.lora.LoRAConfig fields (rank 0: off). Every task builds its network through `with_lora`: adapters
    on the blocks' projections, the rest frozen, so only the adapters (and lora.modules_to_save) are optimised.
    With a pretrained base (`lora_base`), checkpoints hold the trained parameters only and name the base
    (hparams `pretrained`); zoo.load and mode=export rebuild base + adapters and merge them.
    """

    family: ClassVar[str] = ""  # the model family, a key of zoo.export.FAMILIES (model=<family>)
    # Where the family's attentions are and how to set an option in one of them: what an error about an attention
    # variant or position option that does not fit names instead (zoo.errors.PlacementError).
    attention_placements: ClassVar[tuple[AttentionPlacement, ...]] = ()
    net: torch.nn.Module
    tokenizer: Any = None  # text tasks: a Hugging Face tokenizer, kept in every checkpoint as JSON
    # Whether the family's network has Transformer blocks whose projections LoRA adapts (the RNN has none).
    takes_lora: ClassVar[bool] = True

    def __init__(
        self,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        compile: bool | str = False,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.optimizer_config = dict(optimizer or {})
        self.scheduler_config = dict(scheduler or {})
        self.compile_backend = compile_backend(compile)
        self.lora = LoRAConfig(**(lora or {}))
        if self.lora.enabled and not self.takes_lora:
            raise ValueError(
                f"model.lora.rank={self.lora.rank}: LoRA adapts the attention and MLP projections of Transformer "
                f"blocks and the {self.family} family has none; set model.lora.rank=0"
            )

    # -- LoRA -----------------------------------------------------------------------------------------
    def with_lora(self, net: torch.nn.Module) -> torch.nn.Module:
        """`net` with the adapters of model.lora (in place, the rest frozen); unchanged when lora.rank is 0."""
        return add_lora(net, self.lora) if self.lora.enabled else net

    def lora_base(self, pretrained: str | None) -> str | None:
        """What hparams `pretrained` keeps once the network is built from it: without LoRA nothing (checkpoints
        hold every weight and reload without the base), with LoRA the base itself (an existing path resolved):
        checkpoints then hold the trained parameters only and name it."""
        if not (pretrained and self.lora.enabled):
            return None
        path = Path(pretrained).expanduser()
        return str(path.resolve()) if path.exists() else str(pretrained)

    def configure_model(self) -> None:
        if self.compile_backend == "inductor" and self.device.type == "cpu" and (missing := missing_cpp_compiler()):
            log.warning(f"model.compile: {missing}; training eager (model.compile=false hides this warning)")
            self.compile_backend = None
        if self.compile_backend and getattr(self, "_compiled_net", None) is None:
            # Kept outside the module tree: parameter names, and so checkpoints, stay those of the plain network.
            object.__setattr__(self, "_compiled_net", torch.compile(self.net, backend=self.compile_backend))

    def network(self) -> torch.nn.Module:
        """The network a step calls: compiled (model.compile) in training steps only. Validation, test and
        sampling run it eager: each would compile graphs of its own (no grad, other shapes, inference mode),
        14-25 s apiece on the CPU, for a few percent of the run's steps."""
        compiled = getattr(self, "_compiled_net", None)
        if compiled is not None and self.training and torch.is_grad_enabled():
            return compiled
        return self.net

    def logging_this_step(self) -> bool:
        """Whether the loggers write step metrics after this step (every trainer.log_every_n_steps). Each
        self.log costs Lightning a few percent of a small model's step if done at every step (figures in
        experiments/results/recipes.md)."""
        step, every = self.trainer.global_step + 1, self.trainer.log_every_n_steps
        return (every > 0 and step % every == 0) or step == self.trainer.max_steps

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.net, **self.optimizer_config)
        schedule = dict(self.scheduler_config)
        name = schedule.pop("name", "cosine")
        total = int(self.trainer.estimated_stepping_batches)
        warmup = schedule.pop("warmup_steps", None)
        if warmup is None:
            warmup = round(schedule.pop("warmup_ratio", 0.0) * total)
        schedule.pop("warmup_ratio", None)
        min_lr = schedule.pop("min_lr", 0.0)
        if schedule:
            raise ValueError(
                f"unknown scheduler options {sorted(schedule)}; valid: name, warmup_steps, warmup_ratio, min_lr"
            )
        base_lr = self.optimizer_config.get("lr", 1e-3)
        factor = lr_multiplier(name, total, warmup, min_lr / base_lr if base_lr else 0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        if gradient_clip_val and isinstance(self.trainer.strategy, FSDPStrategy) and gradient_clip_algorithm != "value":
            # Parameters are sharded: only the root FSDP module knows the global norm (FSDP.clip_grad_norm_).
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["zoo"] = identity(self)
        if self.lora.enabled and self.hparams.get("pretrained"):  # the base is named: keep what trained only
            trained = {f"net.{name}" for name, parameter in self.net.named_parameters() if parameter.requires_grad}
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trained}
            checkpoint[ADAPTERS_ONLY] = True
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer_to_string(self.tokenizer)  # plain text: weights_only-safe
        datamodule = self.attached_datamodule()
        if hasattr(datamodule, "preprocessing"):  # image data: how new images must be read (zoo.load, mode=predict)
            checkpoint["preprocessing"] = datamodule.preprocessing().to_dict()

    def attached_datamodule(self) -> Any:
        """The trainer's datamodule, None outside a Trainer."""
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    # -- before fit: everything a checkpoint is checked against --------------------------------------
    def take_data(self, datamodule: Any) -> None:
        """Take from the set-up data what the network is built with (GPT: the vocabulary), so that a checkpoint is
        checked against the whole network before fit, before any logger writes into the run directory. Nothing
        here; tasks whose network waits for the data override it and call it from setup()."""

    def check_checkpoint(self, checkpoint: dict[str, Any], path: str) -> None:
        """Refuse a checkpoint this task cannot start from (weights of another shape), naming the first misfit."""
        check_weights(checkpoint, self, path)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint.get(ADAPTERS_ONLY) and getattr(self, "net", None) is not None:
            checkpoint["state_dict"] = {**self.state_dict(), **checkpoint["state_dict"]}  # the base, from itself
        task, family = checkpoint_identity(checkpoint)
        if family and self.family and family != self.family:
            raise CheckpointError(
                f"this checkpoint holds a {family} model (written by {task}), not a {self.family} one; "
                f"pass model={family}"
            )
        if "tokenizer" in checkpoint:
            self.restore_tokenizer(tokenizer_from_string(checkpoint["tokenizer"]))
        if self._trainer is not None and not isinstance(self.trainer.strategy, FSDPStrategy):  # FSDP: sharded
            # Before Lightning loads the weights: a checkpoint of another shape is one line also where fit is called
            # without zoo's pipeline (which checks before fit, zoo.app.pipeline.prepare_checkpoint).
            check_weights(checkpoint, self, str(self.trainer.ckpt_path))

    def restore_tokenizer(self, tokenizer: Any) -> None:
        """Take a checkpoint's tokenizer and hand it to a datamodule that encodes text (`use_tokenizer`), so
        the data is encoded with the model's own vocabulary; keep the datamodule's prepared copy."""
        self.tokenizer = tokenizer
        datamodule = self.attached_datamodule()
        if hasattr(datamodule, "use_tokenizer"):
            datamodule.use_tokenizer(tokenizer)
            self.tokenizer = datamodule.tokenizer


def missing_cpp_compiler() -> str | None:
    """Why TorchInductor cannot build CPU kernels here (no C++ compiler), or None when it can."""
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return "TorchInductor needs a C++ compiler for the CPU and found none (install g++, or set CXX)"
    return None


def compile_backend(compile: bool | str) -> str | None:
    """model.compile: false, true (TorchInductor) or a torch.compile backend by name (e.g. aot_eager)."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "inductor"
    import torch._dynamo

    backends = [name for name in torch._dynamo.list_backends(exclude_tags=()) if "TESTING" not in name]
    if compile not in backends:
        raise ValueError(
            f"unknown model.compile backend {compile!r}; valid: true, false, {', '.join(sorted(backends))}"
        )
    return str(compile)
