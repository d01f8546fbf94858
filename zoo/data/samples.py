"""Data loading that names the sample when it fails: a sample that raises, or a DataLoader worker that dies.

`NamedSamples(dataset, split, num_workers)` wraps a map-style dataset. An exception raised while loading
sample i becomes one DataError naming the split, the index and, when the dataset can say
(`dataset.sample_source(i)`), the file. Each DataLoader worker writes (its pid, the index it is loading) into
a small shared-memory table before it loads a sample, so when a worker is killed (out of memory, `kill -9`)
`lost_worker` can name the sample it was on; PyTorch itself only says "DataLoader worker (pid 1234) exited
unexpectedly".
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

from zoo.errors import DataError, one_line

# Every NamedSamples of this process, for lost_worker to search (weak: a dataset that is gone is not kept).
_LIVE: weakref.WeakSet[NamedSamples] = weakref.WeakSet()


class NamedSamples(Dataset):
    """`dataset` whose failures name the sample (split, index, file); see the module docstring."""

    def __init__(self, dataset: Dataset, split: str, num_workers: int = 0) -> None:
        self.dataset, self.split = dataset, split
        # (pid, index) per worker; -1 = nothing loaded yet. In shared memory: workers write, the main process reads.
        self.loading = torch.full((max(num_workers, 1), 2), -1, dtype=torch.int64).share_memory_()
        _LIVE.add(self)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        worker = get_worker_info()
        if worker is not None and worker.id < len(self.loading):
            self.loading[worker.id] = torch.tensor([os.getpid(), int(index)])
        try:
            return self.dataset[index]
        except DataError:
            raise
        except Exception as error:
            what = f"{type(error).__name__}: {one_line(error)}"
            raise DataError(f"{self.describe(index)} cannot be loaded ({what})") from error

    def describe(self, index: int) -> str:
        """`train sample 17 (data/cat/003.png)`."""
        source = getattr(self.dataset, "sample_source", None)
        where = source(index) if source is not None else None
        return f"{self.split} sample {index}" + (f" ({where})" if where else "")

    def sample_source(self, index: int) -> str | None:
        source = getattr(self.dataset, "sample_source", None)
        return source(index) if source is not None else None


# "DataLoader worker (pid(s) 1234, 1235) exited unexpectedly" (Python) / "... (pid 1234) is killed by signal: Killed."
WORKER_DIED = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? (?P<pids>[\d, ]+)\) (?P<how>exited unexpectedly|is killed by signal: [^.]+"
    r"|exited with (?:exit )?code -?\d+)"
)


def lost_worker(error: BaseException) -> str | None:
    """One line for a DataLoader worker that died, naming the sample it was loading; None for other errors."""
    match = WORKER_DIED.search(str(error)) if isinstance(error, RuntimeError) else None
    if match is None:
        return None
    pids = {int(pid) for pid in re.findall(r"\d+", match.group("pids"))}
    how = match.group("how").replace("is killed", "was killed")
    hint = "(killed for memory? try fewer data.num_workers or a smaller data.batch_size)"
    for samples in list(_LIVE):
        for slot, (pid, index) in enumerate(samples.loading.tolist()):
            if pid in pids and index >= 0:
                return f"data-loader worker {slot} (pid {pid}) {how} while loading {samples.describe(index)} {hint}"
    return f"a data-loader worker (pid {', '.join(map(str, sorted(pids)))}) {how} {hint}"
