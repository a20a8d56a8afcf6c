"""Where the pool's nodes come from when they are not written by hand (Slurm, node agents)."""

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
from gpupool_hub.inventory.agents import DEFAULT_AGENT_TIMEOUT, AgentInventory, AgentReports, NodeReport
from gpupool_hub.inventory.sources import (
    SOURCES,
    ConfigInventory,
    InventorySource,
    NodeStatus,
    SlurmInventorySource,
    make_source,
)

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
    "make_source",
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
