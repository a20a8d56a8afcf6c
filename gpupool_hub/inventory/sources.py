"""Inventory sources: where the pool's nodes come from, and what outside the hub holds.

One small interface (:class:`InventorySource`), chosen by ``c.GPUPool.inventory``:

=========== ==================================================================
``config``  ``c.GPUPool.nodes`` as written; nothing is ever held outside the hub
``agents``  what the node agents report (:class:`~.agents.AgentInventory`):
            a node joins when its agent reports, takes no placements while
            its agent is silent
=========== ==================================================================

An engine adds its own (``engines.Engine.inventory``: Slurm's ``scontrol show node``, whose
nodes Slurm will not schedule on and GPUs it gave to any job :meth:`InventorySource.node_status`
reports). The service's inventory job (``service/jobs/node_refresh.py``) reads
``node_status`` every ``refresh_interval`` seconds and subtracts what jobs the
hub did not start hold, and what nodes that take no placements have free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SOURCES", "ConfigInventory", "InventorySource", "NodeStatus", "SourceDown", "SourceIncomplete"]


@dataclass(frozen=True)
class NodeStatus:
    """One node as its source sees it now."""

    name: str
    takes_placements: bool = True
    why_not: str | None = None
    #: GPU indices some job holds (the hub's own jobs included); the job subtracts the hub's
    gpus_in_use: frozenset[int] = frozenset()
    #: what an admin must fix about the node (an unmapped GRES type), shown on the pool map
    problem: str | None = None
    #: GPUs its scheduler gave whole to one job while another holds shards of them (``slurm.shared.SharedGpu``)
    shared: tuple[Any, ...] = ()


class SourceDown(Exception):
    """The source's controller does not answer now (down, restarting): the pool keeps its last word,
    and the refresh says so once (``inventory/outage.py``)."""


class SourceIncomplete(Exception):
    """The source answered without all it should (a scheduler that just restarted): the pool keeps its
    last word until a full answer."""


class InventorySource:
    """The pool's nodes (``c.GPUPool.nodes`` format) and their current status."""

    #: whether node_status() says anything (the service schedules a refresh job only then)
    dynamic = False
    #: whether the nodes are what node agents report (the service rebuilds the pool on a report)
    follows_reports = False
    #: seconds between refreshes of node_status (dynamic sources)
    refresh_interval = 30.0
    #: where the pool's hardware comes from, told with a held allocation whose GPUs the pool lacks
    hardware_hint = "check the node in c.GPUPool.nodes"

    def nodes(self) -> list[dict[str, Any]]:
        raise NotImplementedError("Subclass must provide implementation")

    def node_status(self) -> dict[str, NodeStatus]:
        """Per node name; a node left out takes placements and has nothing held outside the hub.
        Raises :class:`SourceDown` or :class:`SourceIncomplete` when the source cannot answer in full."""
        return {}


class ConfigInventory(InventorySource):
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._nodes)


#: the pool's own names for ``c.GPUPool.inventory`` (engines add theirs: ``config.inventory_sources``); this
#: module stays below the sources built on it (``inventory/agents.py``, an engine's own)
SOURCES = ("config", "agents")
