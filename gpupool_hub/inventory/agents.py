"""``c.GPUPool.inventory = "agents"``: the pool is what the node agents report.

Each node's agent (``gpupool-agent``) discovers its GPUs through NVML (UUIDs,
models, memory, NVLink/PCIe links, MIG instances with profile and UUID) and
sends them as a ``c.GPUPool.nodes`` entry to ``PUT nodes/{node}/inventory``;
every call it makes (the inventory, the enforcement list it fetches each tick)
shows it is alive. So:

- a node **joins** the pool when its agent first reports (the service rebuilds
  the placement pool, keeping every held allocation);
- a node whose agent has not called for ``c.GPUPool.agent_timeout`` seconds
  **takes no new placements** (:meth:`AgentInventory.node_status` says so, and
  the service holds its free GPUs like a drained Slurm node's); the servers
  already there keep their allocations;
- it **rejoins** as soon as its agent calls again.

:class:`AgentReports` is the one home of what agents said, whatever the
inventory source (with ``config`` or ``slurm`` the reports are only compared
with the configured nodes). It is plain data: the caller passes the times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..placement.hardware import Node
from .sources import InventorySource, NodeStatus

__all__ = ["DEFAULT_AGENT_TIMEOUT", "AgentInventory", "AgentReports", "NodeReport"]

#: seconds of silence after which a node takes no new placements: six ticks of
#: the agent's default 15 s interval, so one slow or lost call never drops a node
DEFAULT_AGENT_TIMEOUT = 90.0


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class NodeReport:
    """The latest word of one node's agent."""

    inventory: dict[str, Any] | None = None
    node: Node | None = None
    received_at: datetime | None = None
    last_seen: datetime | None = None
    differences: list[str] = field(default_factory=list)
    #: GPU UUID -> why the agent cannot attribute that GPU's use to users (absent: it can)
    unattributed: dict[str, str] = field(default_factory=dict)


class AgentReports:
    """What each node's agent last reported, and when it last called."""

    def __init__(self) -> None:
        self._reports: dict[str, NodeReport] = {}

    def get(self, name: str) -> NodeReport | None:
        return self._reports.get(name)

    def __getitem__(self, name: str) -> NodeReport:
        return self._reports[name]

    def __contains__(self, name: object) -> bool:
        return name in self._reports

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._reports))

    def seen(self, name: str, at: datetime) -> NodeReport:
        """An agent of node ``name`` called at ``at``."""
        report = self._reports.setdefault(name, NodeReport())
        report.last_seen = at
        return report

    def accept(self, name: str, inventory: dict[str, Any], node: Node, at: datetime,
               differences: list[str]) -> NodeReport:
        """Store a validated inventory (the caller checked it: nothing here can fail).
        Not a sign of life by itself: an admin may send a node's inventory too."""
        report = self._reports.setdefault(name, NodeReport())
        report.inventory = inventory
        report.node = node
        report.received_at = at
        report.differences = differences
        return report

    def attribution(self, name: str, unattributed: dict[str, str], at: datetime) -> NodeReport:
        """The node's agent says which of its GPUs' use it cannot attribute, and why."""
        report = self.seen(name, at)
        report.unattributed = dict(unattributed)
        return report

    def inventories(self) -> list[dict[str, Any]]:
        """The reported nodes (``c.GPUPool.nodes`` entries), by node name."""
        return [r.inventory for _, r in sorted(self._reports.items()) if r.inventory is not None]

    def silence(self, name: str, now: datetime) -> float | None:
        """Seconds since node ``name``'s agent last called (None: it never did)."""
        report = self._reports.get(name)
        if report is None or report.last_seen is None:
            return None
        return max((now - report.last_seen).total_seconds(), 0.0)


class AgentInventory(InventorySource):
    """Nodes from the agents' reports; silent nodes take no placements."""

    dynamic = True
    follows_reports = True
    hardware_hint = "its node agent reports other GPUs than the allocation holds"

    def __init__(self, timeout: float = DEFAULT_AGENT_TIMEOUT, *, reports: AgentReports | None = None,
                 clock: Callable[[], datetime] = _utcnow) -> None:
        if timeout <= 0:
            raise ValueError(f"c.GPUPool.agent_timeout must be positive, got {timeout!r}")
        self.timeout = timeout
        self.reports = reports if reports is not None else AgentReports()
        self.clock = clock

    @property
    def refresh_interval(self) -> float:
        """How often the service re-checks who is silent: a node is out within timeout + this."""
        return max(1.0, min(10.0, self.timeout / 6))

    def nodes(self) -> list[dict[str, Any]]:
        return self.reports.inventories()

    def node_status(self) -> dict[str, NodeStatus]:
        now = self.clock()
        out = {}
        for name in self.reports:
            silent = self.reports.silence(name, now)
            if silent is not None and silent > self.timeout:
                out[name] = NodeStatus(name, takes_placements=False,
                                       why_not=f"its node agent has not reported for {silent:.0f} s")
            else:
                out[name] = NodeStatus(name)
        return out
