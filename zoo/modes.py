"""Imports every module that registers a run mode with zoo.pipeline.register_mode."""

import zoo.tasks.language_model  # noqa: F401  (mode=generate)
import zoo.tasks.translation  # noqa: F401  (mode=translate)
