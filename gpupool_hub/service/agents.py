"""The two endpoints node agents call: report inventory, fetch the enforcement list.

Agents are not hub users: each node has its own shared secret
(``c.GPUPoolService.agent_tokens = {"node-a": "…"}``, passed to the app as the
``agent_tokens`` setting). A node's token is good for that node's URLs only,
so a compromised node cannot rewrite another node's inventory. Admins (hub
token with the admin scope) may call them too, to inspect or test.

State is kept in memory on the manager (``node_reports``, read by the pool
view and future placement; ``enforce_users``/``enforce_kernel_users``, filled
by the culling job): an agent re-reports within minutes after a restart, so
persisting it would only add a way to serve stale hardware facts.
"""

from __future__ import annotations

import hmac
import logging
import time
from datetime import datetime, timezone
from typing import Any

from tornado import web
from tornado.escape import url_unescape

from ..placement.errors import InventoryError
from ..placement.inventory import load_node
from ..placement.request import normalize_model
from .handlers import APIHandler
from .manager import _iso

log = logging.getLogger("gpupool.agents")

MAX_INVENTORY_BYTES = 1 << 20


def _state(manager: Any, name: str, factory: type) -> Any:
    """An attribute on the manager, created on first use (the manager predates agents)."""
    value = getattr(manager, name, None)
    if value is None:
        value = factory()
        setattr(manager, name, value)
    return value


def node_reports(manager: Any) -> dict[str, dict[str, Any]]:
    """Latest report per node: ``{"inventory", "node", "received_at", "last_seen", "differences"}``."""
    return _state(manager, "node_reports", dict)


def pool_differences(manager: Any, node: Any) -> list[str]:
    """How a reported node differs from the configured pool (empty: it matches, or is not configured)."""
    pool = getattr(manager, "pool", None)
    configured = getattr(pool, "by_name", {}).get(node.name) if pool is not None else None
    if configured is None:
        return [f"node {node.name!r} is not in the configured pool (c.GPUPool.nodes)"]
    conf = {g.index: g for g in configured.node.gpus}
    seen = {g.index: g for g in node.gpus}
    out = []
    for index in sorted(set(conf) | set(seen)):
        c, s = conf.get(index), seen.get(index)
        if c is None:
            out.append(f"GPU {index} ({s.model}) is present but not configured")
        elif s is None:
            out.append(f"GPU {index} ({c.model}) is configured but not present")
        elif normalize_model(c.model) != normalize_model(s.model):
            out.append(f"GPU {index} is a {s.model}, configured as {c.model}")
    return out


class AgentHandler(APIHandler):
    """Accepts the node's own agent token, or a hub token with the admin scope."""

    node: str

    async def prepare(self) -> None:  # type: ignore[override]
        self._started = time.perf_counter()
        self.node = url_unescape(self.path_args[0], plus=False) if self.path_args else ""
        token = self._token()
        tokens = self.settings.get("agent_tokens") or {}
        if token is not None:
            for name, secret in tokens.items():
                if secret and hmac.compare_digest(token.encode(), str(secret).encode()):
                    if name != self.node:
                        raise web.HTTPError(403, f"this agent token belongs to node {name!r}, not {self.node!r}")
                    self.identity = {"kind": "agent", "name": name, "scopes": [], "groups": []}
                    return
            if "hub_auth" not in self.settings:  # no hub to ask (agent-only deployments, tests)
                raise web.HTTPError(401, "invalid agent token")
        await super().prepare()  # 401 without a token; hub check otherwise
        if not self.is_admin:
            raise web.HTTPError(403, f"node endpoints need node {self.node!r}'s agent token or the admin scope")

    def touch(self) -> dict[str, Any]:
        report = node_reports(self.manager).setdefault(self.node, {})
        if self.identity.get("kind") == "agent":
            report["last_seen"] = datetime.now(timezone.utc)
        return report


class InventoryHandler(AgentHandler):
    def put(self, _node: str) -> None:
        if len(self.request.body or b"") > MAX_INVENTORY_BYTES:
            raise web.HTTPError(413, f"inventory larger than {MAX_INVENTORY_BYTES} bytes")
        body = self.json_body()
        name = body.setdefault("name", self.node)
        if name != self.node:
            raise web.HTTPError(400, f"inventory names node {name!r} but was sent for {self.node!r}")
        try:
            node = load_node(body, "inventory")
        except InventoryError as e:
            raise web.HTTPError(400, f"invalid inventory: {e}") from None
        differences = pool_differences(self.manager, node)
        report = self.touch()
        report.update(inventory=body, node=node, received_at=datetime.now(timezone.utc), differences=differences)
        if differences:
            log.warning("Node %s reports hardware that differs from the pool: %s", self.node, "; ".join(differences))
        self.write_json({"node": self.node, "gpus": len(node.gpus), "accepted": True, "differences": differences})

    def get(self, _node: str) -> None:
        report = node_reports(self.manager).get(self.node)
        if not report or "inventory" not in report:
            raise web.HTTPError(404, f"node {self.node!r} has not reported an inventory")
        self.write_json({"node": self.node, "inventory": report["inventory"],
                         "received_at": _iso(report["received_at"]), "last_seen": _iso(report.get("last_seen")),
                         "differences": report["differences"]})


class EnforceHandler(AgentHandler):
    def get(self, _node: str) -> None:
        self.touch()
        users = _state(self.manager, "enforce_users", set)
        kernels = _state(self.manager, "enforce_kernel_users", set)
        self.write_json({
            "users": sorted(users),
            # users whose kernels of a running server may be stopped too (default: none; the hub culls those)
            "kernels": sorted(set(kernels) & set(users)),
            "dry_run": bool(self.settings.get("agent_dry_run", False)),
        })


def agent_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes to append to :func:`gpupool_hub.service.handlers.routes`."""
    api = prefix.rstrip("/") + "/api/v1"
    node = r"([^/]+)"
    return [
        (rf"{api}/nodes/{node}/inventory", InventoryHandler),
        (rf"{api}/nodes/{node}/enforce", EnforceHandler),
    ]
