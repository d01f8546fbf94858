"""Lines Lightning prints on every run that tell the user nothing: filtered out, real warnings kept.

Dropped: Lightning's "💡 Tip: ... try installing litlogger / litmodels" advertisements, torch's "No CUDA
runtime is found" (a compiled run on a CPU-only machine with a CUDA toolkit), and the accelerator census when
it only says that a device is absent and unused ("GPU available: False, used: False", "TPU available: False,
..."). A GPU that is there but unused is still reported (Lightning warns about it), and nothing sent through
the warnings module is touched. And each of Lightning's lines is printed once: Lightning gives its logger a
console handler of its own ("INFO: ..." on stderr) that also passes every line on to the root logger, where
Hydra's console and run.log handlers print it again; once the root logger has handlers, Lightning's own steps
aside.
"""

from __future__ import annotations

import logging
import re

BANNERS = (
    r"💡 Tip: ",
    r"GPU available: False, used: False$",
    r"(TPU|HPU|IPU) available: False\b",
    r"No CUDA runtime is found",  # torch.compile on a CPU-only machine with a CUDA toolkit installed: nothing to fix
)

# rank_zero_info writes through these loggers (Lightning's trainer setup and logger connector use them).
LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
OTHER_LOGGERS = ("torch.utils.cpp_extension",)  # imported by torch.compile's CPU backend


class DropBanners(logging.Filter):
    """A logging filter that drops records matching one of `BANNERS`."""

    pattern = re.compile("|".join(f"(?:{banner})" for banner in BANNERS))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.search(record.getMessage()) is None


class LeftToTheRoot(logging.Filter):
    """On a console handler of a logger that passes its lines on to the root: drops them while the root logger
    has handlers of its own (Hydra's console and run.log), which print them anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def silence_banners() -> None:
    """Install the filters on Lightning's loggers and handlers (once: installing them again is a no-op)."""
    for name in LIGHTNING_LOGGERS + OTHER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropBanners) for f in logger.filters):
            logger.addFilter(DropBanners())
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in logger.handlers if logger.propagate else ():
            if isinstance(handler, logging.StreamHandler) and not any(
                isinstance(f, LeftToTheRoot) for f in handler.filters
            ):
                handler.addFilter(LeftToTheRoot())
