"""Lines Lightning prints on every run that tell the user nothing: filtered out, real warnings kept.

Dropped: the "💡 Tip: ... try installing litlogger" advertisement, and the accelerator census when it only says
that a device is absent and unused ("GPU available: False, used: False", "TPU available: False, ..."). A
GPU that is there but unused is still reported (Lightning warns about it), and nothing sent through the
warnings module is touched.
"""

from __future__ import annotations

import logging
import re

BANNERS = (
    r"💡 Tip: .*litlogger",
    r"GPU available: False, used: False$",
    r"(TPU|HPU|IPU) available: False\b",
)

# rank_zero_info writes through these loggers (Lightning's trainer setup and logger connector use them).
LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class DropBanners(logging.Filter):
    """A logging filter that drops records matching one of `BANNERS`."""

    pattern = re.compile("|".join(f"(?:{banner})" for banner in BANNERS))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.search(record.getMessage()) is None


def silence_banners() -> None:
    """Install the filter on Lightning's loggers (once: adding it again is a no-op)."""
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropBanners) for f in logger.filters):
            logger.addFilter(DropBanners())
