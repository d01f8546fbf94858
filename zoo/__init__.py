"""zoo: a multi-domain Transformer model zoo. Layers, imports only pointing down (tests/test_layers.py):

zoo/attention/   the shared attention core: MultiHeadAttention, kernels behind one contract, positions
zoo/nn/          Transformer blocks, MLP, activations, the model-config base
zoo/models/      the model families as pure nn.Modules, one file each (zoo.export.FAMILIES lists them)
zoo/data/        LightningDataModules, tokenizers, generators
zoo/training/    Lightning infrastructure: callbacks, checkpoint writing, precision, distributed, loggers
zoo/tasks/       LightningModules: loss, metrics, optimiser, schedules
zoo/app/         the command line (run.py): Hydra, the pipeline, modes, sweeps, launchers
zoo/errors.py    error types and checks every layer may raise;  zoo/weights.py  the one weight reader
zoo/export.py    a trained model outside training: load a checkpoint or exported folder, export it

`zoo.load(path)` (zoo.export.load) is imported on first use, so `import zoo` stays light.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "load":
        from zoo.export import load

        return load
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
