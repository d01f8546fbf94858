"""Processes started by torchrun or SLURM's srun: one run directory for all of them, config written once.

Kept free of torch and Lightning imports: run.py calls it before Hydra starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MULTIRUN_FLAGS = ("-m", "--multirun")


def launch_info(environ: Mapping[str, str]) -> tuple[int, int, str | None]:
    """(global rank, world size, launch id) of a process started by torchrun or SLURM's srun;
    (0, 1, None) otherwise. The launch id is shared by every process of the launch."""
    if "TORCHELASTIC_RUN_ID" in environ and "RANK" in environ:
        run_id = environ["TORCHELASTIC_RUN_ID"]
        return (
            int(environ["RANK"]),
            int(environ.get("WORLD_SIZE", 1)),
            None if run_id == "none" else f"torchrun-{run_id}",
        )
    if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", 1)) > 1 and "SLURM_STEP_ID" in environ:
        launch_id = f"slurm-{environ.get('SLURM_JOB_ID', 'job')}.{environ['SLURM_STEP_ID']}"
        return int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"]), launch_id
    return 0, 1, None


def external_launch_overrides(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """Hydra overrides that make the N processes of a torchrun/srun launch one run.

    Every process computes its own `${now:...}` run directory, so they would land in N directories:
    all of them get the same one, named after the launch (outputs/<task>/slurm-<job>.<step> or
    outputs/<task>/torchrun-<rdzv id>), unless hydra.run.dir is given. Ranks above 0 do not write
    .hydra/ (the config) and log to rank<N>.log, as Lightning does for the processes it starts itself.
    """
    rank, world_size, launch_id = launch_info(environ)
    if world_size <= 1 or any(flag in argv for flag in MULTIRUN_FLAGS):
        return []
    overrides = []
    if launch_id is not None and not any(arg.startswith("hydra.run.dir=") for arg in argv):
        overrides.append(f"hydra.run.dir=${{paths.log_dir}}/${{task_name}}/{launch_id}")
    if rank > 0:
        overrides += ["hydra.output_subdir=null", f"hydra.job.name=rank{rank}"]
    return overrides
