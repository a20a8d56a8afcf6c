"""Where the pool's nodes come from when they are not written by hand: the node agents' reports
(``agents``), or an engine's own source (Slurm's is ``gpupool_hub.engines.slurm.inventory``)."""

from gpupool_hub.inventory.agents import DEFAULT_AGENT_TIMEOUT, AgentInventory, AgentReports, NodeReport
from gpupool_hub.inventory.sources import SOURCES, ConfigInventory, InventorySource, NodeStatus

__all__ = ["DEFAULT_AGENT_TIMEOUT", "AgentInventory", "AgentReports", "NodeReport", "SOURCES", "ConfigInventory",
           "InventorySource", "NodeStatus"]
