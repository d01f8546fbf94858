"""LightningModules, one per model family: loss, metrics, optimiser, schedules, sampling. Their import paths
(zoo.tasks.<module>.<Class>) are written into checkpoints: keep them."""
