"""Data (LightningDataModules), tokenizers and generators. Never imports models: a model config reads what
it needs from the data through the Hydra config (`data.image_size`, `data.vocab_size`, ...)."""
