"""SplitDataModule: the base of zoo's data modules, whose train, val and test loaders differ only by split."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader


class SplitDataModule(L.LightningDataModule):
    """Lightning's three loaders as one `loader(split)` (train | val | test) that subclasses implement; by
    zoo's convention training shuffles and takes `batch_size`, val and test keep their order and take
    `eval_batch_size` (`batch_size_of`)."""

    def loader(self, split: str) -> DataLoader:
        raise NotImplementedError

    def batch_size_of(self, split: str) -> int:
        return self.batch_size if split == "train" else self.eval_batch_size

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
