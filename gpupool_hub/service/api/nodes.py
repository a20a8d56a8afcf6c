"""``nodes/{node}/…``: the endpoints node agents call. ``inventory``: report the node's
GPUs; ``enforce``: fetch the enforcement list; ``utilization``: GPU utilization, for idle
reclaim without Prometheus; ``attribution``: which GPUs' use the agent cannot attribute to users, and why (the
admins' pool map); ``memory``: the memory guard's shares to watch, its warnings and
stops (rules in ``service/core/memory.py`` and ``agent/memguard.py``); ``boundary``: who holds
each GPU, and the processes found out of bounds (rules in ``agent/boundary.py``). New
warnings and every stop go to the audit log.

Agents are not hub users: each node has its own shared secret
(``c.GPUPoolService.agent_tokens = {"node-a": "…"}``, passed to the app as the
``agent_tokens`` setting). A node's token is good for that node's URLs only,
so a compromised node cannot rewrite another node's inventory, nor claim another
node's devices (GPU and MIG UUIDs), not even after a restart of the service before
that node reported again: the service remembers each device's node in the ledger
database. Admins (hub token with the admin scope) may call them too, to inspect or
test, and to move a device whose old node is gone.

Reports are kept by the inventory unit (``PoolInventory.reports``; with
``c.GPUPool.inventory = "agents"`` they are the pool) and the enforcement list
by the enforcement unit, which the cull job fills. Every call of a node's own
agent counts as a sign of life of that node.

One agent process speaks for a node at a time (``core/agent_leases.py``): a call
that names another instance than the live holder's is refused with 409, and
``DELETE nodes/{node}/agent`` gives the node up when an agent stops.

A node's token speaks for its own GPUs, not for anybody: a memory warning must name
a holder of a share of that GPU there (the guard watches only those), a boundary
warning one who does not hold that GPU; else 409, nothing recorded. A boundary
warning is sent once, its deadline now plus the grace, so never in the past; a memory
warning each look while its user stays over, so past its deadline too, never before ``since``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from tornado import web

from ...inventory.agents import NodeReport
from ...ledger import AllocationRecord, AuditEvent
from ...placement.errors import InventoryError
from ...placement.hardware import load_node
from ...timefmt import iso as _iso
from ..core.agent_leases import INSTANCE_HEADER, MAX_INSTANCE_LENGTH, AgentConflict, AgentLeases
from ..core.pool_inventory import DeviceOfAnotherNode
from ..core.memory import boundary_events, holders_on, memory_events, shares_on
from .base import APIHandler
from .openapi import parse_date_time

log = logging.getLogger("gpupool.agents")

MAX_INVENTORY_BYTES = 1 << 20

#: how far behind the service's clock a node's may be before its fresh deadline reads as past
CLOCK_SKEW = timedelta(minutes=5)


class AgentHandler(APIHandler):
    """Accepts the node's own agent token, or a hub token with the admin scope."""

    node: str

    async def authenticate(self) -> None:
        # tornado has URL-decoded the path argument once: that is the node's name
        self.node = self.path_args[0] if self.path_args else ""
        token = self._token()
        tokens = self.context.agent_tokens or {}
        if token is not None:
            for name, secret in tokens.items():
                if secret and hmac.compare_digest(token.encode(), str(secret).encode()):
                    if name != self.node:
                        raise web.HTTPError(403, f"this agent token belongs to node {name!r}, not {self.node!r}")
                    self.path_name(self.node, "node name")
                    self.identity = {"kind": "agent", "name": name, "scopes": [], "groups": []}
                    self.hold_node()
                    return
            if self.context.hub_auth is None:  # no hub to ask (agent-only deployments, tests)
                raise web.HTTPError(401, "invalid agent token")
        await super().authenticate()  # 401 without a token; hub check otherwise
        if not self.is_admin:
            raise web.HTTPError(403, f"node endpoints need node {self.node!r}'s agent token or the admin scope")
        self.path_name(self.node, "node name")

    def instance(self) -> str:
        """The calling agent process (empty: an agent older than the lease, or an admin)."""
        instance = self.request.headers.get(INSTANCE_HEADER, "").strip()
        if instance and not AgentLeases.valid_instance(instance):
            raise web.HTTPError(400, f"{INSTANCE_HEADER} must be 1 to {MAX_INSTANCE_LENGTH} printable ASCII "
                                     "characters")
        return instance

    def hold_node(self) -> None:
        """409 when another live agent process holds this node (core/agent_leases.py)."""
        if not (instance := self.instance()):
            return
        try:
            self.manager.agent_leases.claim(self.node, instance)
        except AgentConflict as e:
            log.warning("Refused agent %s: %s", instance, e)
            raise web.HTTPError(409, str(e)) from None

    @property
    def is_agent(self) -> bool:
        return self.identity.get("kind") == "agent"

    def check_own_devices(self, uuids: Iterable[str]) -> None:
        """403 for a device of another node (reported now or before a restart), 400 for
        one the pool does not have on this node: an agent speaks for its own GPUs only."""
        inventory = self.manager.inventory
        known = {g.uuid for ns in self.manager.pool.nodes if ns.name == self.node for g in ns.node.gpus}
        unknown = sorted(set(uuids) - known)
        foreign = {u: owner for u in unknown if (owner := inventory.owner_of(u)) not in (None, self.node)}
        if foreign:
            uuid, owner = sorted(foreign.items())[0]
            raise web.HTTPError(403, f"GPU {uuid} belongs to node {owner!r}, not {self.node!r}")
        if unknown:
            raise web.HTTPError(400, f"GPU(s) {unknown[:5]} are not in node {self.node!r} of the pool")

    def touch(self) -> None:
        """An agent called: the node is alive (an admin's call says nothing about that)."""
        if self.is_agent:
            self.manager.inventory.seen(self.node)


class InventoryHandler(AgentHandler):
    max_body_bytes = MAX_INVENTORY_BYTES
    openapi_path = "/nodes/{node}/inventory"

    async def put(self, _node: str) -> None:
        body = self.json_body()
        name = body.setdefault("name", self.node)
        if name != self.node:
            raise web.HTTPError(400, f"inventory names node {name!r} but was sent for {self.node!r}")
        try:
            node = load_node(body, "inventory")
        except InventoryError as e:
            raise web.HTTPError(400, f"invalid inventory: {e}") from None
        self.touch()
        try:  # on the writer thread: with the agents inventory a report may rebuild the pool
            report = await self.manager.inventory.accept_report.off_loop(
                self.node, body, node, self.manager.ledger, move_remembered=not self.is_agent)
        except DeviceOfAnotherNode as e:
            raise web.HTTPError(403 if self.is_agent else 400, f"invalid inventory: {e}") from None
        except InventoryError as e:
            raise web.HTTPError(400, f"invalid inventory: {e}") from None
        self.write_json({"node": self.node, "gpus": len(node.gpus), "accepted": True,
                         "differences": report.differences})

    def get(self, _node: str) -> None:
        report: NodeReport | None = self.manager.inventory.reports.get(self.node)
        if report is None or report.inventory is None:
            raise web.HTTPError(404, f"node {self.node!r} has not reported an inventory")
        self.write_json({"node": self.node, "inventory": report.inventory,
                         "received_at": _iso(report.received_at), "last_seen": _iso(report.last_seen),
                         "differences": report.differences})


class EnforceHandler(AgentHandler):
    async def get(self, _node: str) -> None:
        self.touch()
        # "kernels": users whose kernels of a running server may be stopped too (default: none;
        # the hub culls those); "allowed": GPUs still held by users whose kernels were culled
        held: dict[str, list[str]] = {}
        if self.manager.enforcement.stray_users():
            for r in await self.manager.records.active_allocations.off_loop():
                held.setdefault(r.user, []).extend(g["uuid"] for g in r.gpus)
        self.write_json({**self.manager.enforcement.agent_list(held), "dry_run": self.context.agent_dry_run,
                         # e.g. after a restart of the service: the agent sends its inventory at once
                         "report_inventory": self.manager.inventory.wants_report(self.node)})


class UtilizationHandler(AgentHandler):
    """Body: ``{"gpus": {"<GPU UUID>": 0.0-1.0, ...}, "memory": {"<GPU UUID>": [used, total], ...},
    "users": {"<GPU UUID>": {"<user>": 0.0-1.0}}}`` (memory in bytes; ``users`` per GPU whose use
    the agent can attribute; both optional), the node's own agent token or an admin."""

    max_body_bytes = 64 * 1024
    openapi_path = "/nodes/{node}/utilization"

    def put(self, _node: str) -> None:
        source = self.context.utilization
        if source is None:
            raise web.HTTPError(409, "this service reads GPU utilization from Prometheus; reports are not used")
        body = self.json_body()
        gpus, memory, users = body["gpus"], body.get("memory", {}), body.get("users", {})
        for uuid, (used, total) in memory.items():
            if used > total:
                raise web.HTTPError(400, f"request body field /memory/{uuid} says more used than the GPU has")
        self.check_own_devices(set(gpus) | set(memory) | set(users))
        self.touch()
        source.report({k: float(v) for k, v in gpus.items()}, datetime.now(timezone.utc),
                      {k: (v[0], v[1]) for k, v in memory.items()},
                      {k: {u: float(x) for u, x in v.items()} for k, v in users.items()})
        self.write_json({"node": self.node, "accepted": len(gpus)})


class AttributionHandler(AgentHandler):
    """Body: ``{"gpus": {"<GPU UUID>": null | "why its use cannot be attributed"}}``."""

    max_body_bytes = 64 * 1024
    openapi_path = "/nodes/{node}/attribution"

    def put(self, _node: str) -> None:
        gpus = self.json_body()["gpus"]
        self.check_own_devices(gpus)
        self.touch()
        self.manager.inventory.attribution_reported(self.node, {u: why for u, why in gpus.items() if why})
        self.write_json({"node": self.node, "unattributed": sum(1 for why in gpus.values() if why)})


MAX_REPORT_BYTES = 256 * 1024


class GuardHandler(AgentHandler):
    """A node guard's two calls (the memory guard's, the boundary guard's): GET the node's
    allocations in the guard's shape; PUT its warnings and actions, which become audit
    events (and the users' notices)."""

    max_body_bytes = MAX_REPORT_BYTES

    def holdings(self, records: list[AllocationRecord]) -> dict[str, Any]:
        raise NotImplementedError("Subclass must provide implementation")

    def audit(self, warnings: list[dict[str, Any]], actions: list[dict[str, Any]], dry: bool,
              now: datetime) -> tuple[list[AuditEvent], dict[str, Any]]:
        """The events to record for a report, and the answer's counts besides ``audited``."""
        raise NotImplementedError("Subclass must provide implementation")

    def warning_problem(self, warning: dict[str, Any], now: datetime) -> str | None:
        """What a schema cannot say is wrong with a warning: its field, then why (400); or None."""
        raise NotImplementedError("Subclass must provide implementation")

    def stranger(self, warning: dict[str, Any], held: dict[str, Any]) -> str | None:
        """Why the warning's user cannot be warned on this node, given ``holdings`` (409); or None."""
        raise NotImplementedError("Subclass must provide implementation")

    async def get(self, _node: str) -> None:
        self.touch()
        records = await self.manager.records.active_allocations.off_loop()
        self.write_json({**self.holdings(records), "dry_run": self.context.agent_dry_run})

    async def put(self, _node: str) -> None:
        body = self.json_body()
        warnings, actions = body["warnings"], body.get("actions", [])
        dry = body.get("dry_run", False) or self.context.agent_dry_run
        self.check_own_devices({x["gpu_uuid"] for x in warnings + actions})
        now = datetime.now(timezone.utc)
        for i, warning in enumerate(warnings):
            if problem := self.warning_problem(warning, now):
                raise web.HTTPError(400, f"request body field /warnings/{i}/{problem}")
        if warnings:  # actions name whoever was stopped, even one who has left since: not checked
            held = self.holdings(await self.manager.records.active_allocations.off_loop())
            for i, warning in enumerate(warnings):
                if why := self.stranger(warning, held):
                    raise web.HTTPError(409, f"warning /warnings/{i} names {warning['user']!r}, who {why}; "
                                             "nothing was recorded")
        self.touch()
        events, counts = self.audit(warnings, actions, dry, now)
        for event in events:
            await self.manager.notices.record.off_loop(event)
        self.write_json({"node": self.node, **counts, "audited": len(events)})


class MemoryHandler(GuardHandler):
    openapi_path = "/nodes/{node}/memory"

    def holdings(self, records: list[AllocationRecord]) -> dict[str, Any]:
        return {"shares": shares_on(records, self.node)}

    def audit(self, warnings: list[dict[str, Any]], actions: list[dict[str, Any]], dry: bool,
              now: datetime) -> tuple[list[AuditEvent], dict[str, Any]]:
        new = self.manager.memory.report(self.node, warnings, dry)
        return memory_events(self.node, new, actions, dry, now), {"warnings": len(warnings)}

    def warning_problem(self, warning: dict[str, Any], now: datetime) -> str | None:
        if warning["used_bytes"] <= warning["limit_bytes"]:
            return "used_bytes is not over limit_bytes: a user under the limit gets no warning"
        if parse_date_time(warning["deadline"]) < parse_date_time(warning["since"]):
            return f"deadline ({warning['deadline']}) is before since ({warning['since']})"
        return None

    def stranger(self, warning: dict[str, Any], held: dict[str, Any]) -> str | None:
        if any(s["user"] == warning["user"] and s["gpu_uuid"] == warning["gpu_uuid"] for s in held["shares"]):
            return None
        return f"holds no share of GPU {warning['gpu_uuid']} on node {self.node!r}"


class BoundaryHandler(GuardHandler):
    openapi_path = "/nodes/{node}/boundary"

    def holdings(self, records: list[AllocationRecord]) -> dict[str, Any]:
        return {"holders": holders_on(records, self.node)}

    def audit(self, warnings: list[dict[str, Any]], actions: list[dict[str, Any]], dry: bool,
              now: datetime) -> tuple[list[AuditEvent], dict[str, Any]]:
        return boundary_events(self.node, warnings, actions, dry, now), {}

    def warning_problem(self, warning: dict[str, Any], now: datetime) -> str | None:
        # sent once, when found, with now plus the agent's grace: a past one claims a grace that never ran
        if parse_date_time(warning["deadline"]) < now - CLOCK_SKEW:
            return (f"deadline ({warning['deadline']}) is in the past: a new warning's grace runs from now "
                    f"(clocks may differ by {int(CLOCK_SKEW.total_seconds() // 60)} minutes)")
        return None

    def stranger(self, warning: dict[str, Any], held: dict[str, Any]) -> str | None:
        # users holding nothing on the node are what the guard is for (a CPU-only server, work beside the hub)
        if warning["user"] in held["holders"].get(warning["gpu_uuid"], ()):
            return f"holds GPU {warning['gpu_uuid']} on node {self.node!r}: their processes there are in bounds"
        return None


class AgentLeaseHandler(AgentHandler):
    """``DELETE``: the calling agent stops and gives its node up, so its successor is served at once."""

    openapi_path = "/nodes/{node}/agent"

    def delete(self, _node: str) -> None:
        instance = self.instance() if self.is_agent else ""
        released = bool(instance) and self.manager.agent_leases.release(self.node, instance)
        if released:
            log.info("Agent %s of node %s stopped and gave the node up", instance, self.node)
        self.write_json({"node": self.node, "released": released})


NODE = r"([^/]+)"

default_handlers = [
    (rf"api/v1/nodes/{NODE}/inventory", InventoryHandler),
    (rf"api/v1/nodes/{NODE}/enforce", EnforceHandler),
    (rf"api/v1/nodes/{NODE}/utilization", UtilizationHandler),
    (rf"api/v1/nodes/{NODE}/attribution", AttributionHandler),
    (rf"api/v1/nodes/{NODE}/memory", MemoryHandler),
    (rf"api/v1/nodes/{NODE}/boundary", BoundaryHandler),
    (rf"api/v1/nodes/{NODE}/agent", AgentLeaseHandler),
]
