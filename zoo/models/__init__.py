"""The model families as pure nn.Modules (no Lightning), one file each with a small dataclass config
(zoo.export.FAMILIES lists them), and what families share: the translation search (seq2seq.py) and the maps of
other libraries' checkpoints, one module per format (convert/)."""
