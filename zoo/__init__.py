"""zoo: a multi-domain Transformer model zoo. Layers, imports only pointing down (tests/test_layers.py):

zoo/attention/   the shared attention core: MultiHeadAttention, kernels behind one contract, positions
zoo/nn/          Transformer blocks, MLP, activations, the model-config base
zoo/models/      the four families as pure nn.Modules (ViT, GPT, translation Transformer, CLIP)
zoo/data/        LightningDataModules, tokenizers, generators
zoo/training/    Lightning infrastructure: callbacks, checkpoint writing, precision, distributed, loggers
zoo/tasks/       LightningModules: loss, metrics, optimiser, schedules
zoo/app/         the command line (run.py): Hydra, the pipeline, modes, sweeps, launchers
zoo/errors.py    error types and checks every layer may raise;  zoo/weights.py  the one weight reader
"""
