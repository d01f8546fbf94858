"""Imports every module that registers a run mode with zoo.pipeline.register_mode."""
