"""Faults injected into real runs (full and read-only disks, corrupt checkpoints, killed ranks and data workers,
preemption signals, broken image folders, bad settings) and what zoo does about each (README, Troubleshooting)."""
