"""The four model families as pure nn.Modules (no Lightning), one file each with a small dataclass config."""
