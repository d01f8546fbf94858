"""Training infrastructure on Lightning (knows Lightning, not Hydra's command line): callbacks that let a run
survive faults, checkpoint writing and checks, mixed precision, distributed helpers, logging and media."""
