"""Where the pool's nodes come from when they are not written by hand (Slurm)."""

from gpupool_hub.inventory.slurm import (
    QueueEntry,
    SlurmCommandError,
    SlurmError,
    SlurmGpu,
    SlurmInventory,
    SlurmJob,
    SlurmNode,
    SlurmOutputError,
    UnmappedGresType,
    run_slurm,
)

__all__ = [
    "QueueEntry",
    "SlurmCommandError",
    "SlurmError",
    "SlurmGpu",
    "SlurmInventory",
    "SlurmJob",
    "SlurmNode",
    "SlurmOutputError",
    "UnmappedGresType",
    "run_slurm",
]
