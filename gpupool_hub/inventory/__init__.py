"""Where the pool's nodes come from when they are not written by hand (Slurm, node agents)."""

from typing import Any

from gpupool_hub.inventory.agents import DEFAULT_AGENT_TIMEOUT, AgentInventory, AgentReports, NodeReport
from gpupool_hub.inventory.sources import (
    SOURCES,
    ConfigInventory,
    InventorySource,
    NodeStatus,
)

#: the Slurm source lives in gpupool_hub.slurm (whose inventory module builds on .sources);
#: its names are still importable from here, on first use
_SLURM = {"QueueEntry", "SlurmCommandError", "SlurmError", "SlurmGpu", "SlurmInventory", "SlurmInventorySource",
          "SlurmJob", "SlurmNode", "SlurmOutputError", "UnmappedGresType", "run_slurm"}

__all__ = [
    "DEFAULT_AGENT_TIMEOUT",
    "AgentInventory",
    "AgentReports",
    "NodeReport",
    "SOURCES",
    "ConfigInventory",
    "InventorySource",
    "NodeStatus",
    "SlurmInventorySource",
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


def __getattr__(name: str) -> Any:
    if name in _SLURM:
        import gpupool_hub.slurm as slurm

        return getattr(slurm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
