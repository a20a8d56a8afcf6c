"""The node agent's calls to the gpupool service (``api/v1/nodes/{node}/…``), with the node's token."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado.escape import url_escape
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .. import strictjson
from .. import __version__
from ..service.core.agent_leases import INSTANCE_HEADER
from .attribution import Snapshot
from .errors import AgentServiceError
from .memguard import Share
from .results import EnforceList


class ServiceClient:
    """The calls the agent makes, authenticated with the node's token."""

    def __init__(self, base_url: str, node: str, token: str, timeout: float = 10.0, instance: str = "") -> None:
        self.api = base_url.rstrip("/") + "/api/v1/nodes/" + url_escape(node, plus=False)
        self.token = token
        self.timeout = timeout
        self.instance = instance  # this agent process, for the node's lease at the service

    async def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json",
                   "User-Agent": f"gpupool-agent/{__version__}"}
        if self.instance:
            headers[INSTANCE_HEADER] = self.instance
        req = HTTPRequest(
            self.api + path, method=method, headers=headers,
            body=None if body is None else json.dumps(body),
            connect_timeout=timeout or self.timeout, request_timeout=timeout or self.timeout,
        )
        try:
            # One client per event loop (tornado caches it); created here, inside the running loop.
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError, asyncio.TimeoutError) as e:
            raise AgentServiceError(f"{method} {req.url}: {e}") from None
        if resp.code >= 300:  # 599: no connection / timeout
            message = ""
            try:
                message = strictjson.loads(resp.body or b"{}").get("message", "")
            except (ValueError, AttributeError):
                pass
            raise AgentServiceError(f"{method} {req.url}: HTTP {resp.code} {message or resp.error or ''}".strip(),
                               resp.code)
        try:
            return strictjson.loads(resp.body or b"{}")
        except ValueError as e:
            raise AgentServiceError(f"{method} {req.url}: answer is not JSON: {e}") from None

    async def release(self, timeout: float) -> Any:
        """This agent stops: give the node up, so a successor is served at once."""
        return await self._call("DELETE", "/agent", timeout=timeout)

    async def report_inventory(self, inventory: dict[str, Any]) -> Any:
        return await self._call("PUT", "/inventory", inventory)

    async def enforcement(self) -> EnforceList:
        data = await self._call("GET", "/enforce")
        users, kernels = data.get("users"), data.get("kernels", [])
        if not isinstance(users, list) or not all(isinstance(u, str) for u in users) or \
                not isinstance(kernels, list) or not all(isinstance(u, str) for u in kernels):
            raise AgentServiceError(f"enforcement answer is malformed: {data!r:.200}")
        allowed = data.get("allowed", {})
        if not isinstance(allowed, dict) or not all(
                isinstance(u, str) and isinstance(g, list) and all(isinstance(x, str) for x in g)
                for u, g in allowed.items()):
            raise AgentServiceError(f"enforcement answer is malformed: {data!r:.200}")
        return EnforceList(frozenset(users), frozenset(kernels), bool(data.get("dry_run", False)),
                           {u: frozenset(g) for u, g in allowed.items()},
                           report_inventory=data.get("report_inventory") is True)

    async def memory_shares(self) -> tuple[list[Share], bool]:
        """The shares of time-shared GPUs on this node, and whether the service asks for a dry run."""
        data = await self._call("GET", "/memory")
        try:
            shares = [Share(str(s["gpu_uuid"]), str(s["user"]), str(s["server"]), int(s["milli"]),
                            str(s.get("class") or "timeslice")) for s in data["shares"]]
        except (KeyError, TypeError, ValueError) as e:
            raise AgentServiceError(f"memory answer is malformed ({e}): {data!r:.200}") from None
        return shares, bool(data.get("dry_run", False))

    async def report_memory(self, report: dict[str, Any]) -> Any:
        return await self._call("PUT", "/memory", report)

    async def gpu_holders(self) -> tuple[dict[str, frozenset[str]], bool]:
        """Who holds each GPU (and MIG instance) of this node, and whether the service asks for a dry run."""
        data = await self._call("GET", "/boundary")
        holders = data.get("holders")
        if not isinstance(holders, dict) or not all(
                isinstance(g, str) and isinstance(u, list) and all(isinstance(x, str) for x in u)
                for g, u in holders.items()):
            raise AgentServiceError(f"boundary answer is malformed: {data!r:.200}")
        return {g: frozenset(u) for g, u in holders.items()}, bool(data.get("dry_run", False))

    async def report_boundary(self, report: dict[str, Any]) -> Any:
        return await self._call("PUT", "/boundary", report)

    async def report_utilization(self, snapshot: Snapshot) -> Any:
        """The GPUs' utilization (0-1) and memory ([used, total] bytes) where NVML knows them, and
        each user's busy fraction of every GPU whose use the agent can attribute (a user left out
        there has no process on it: 0); a GPU missing from ``users`` is unknown per user."""
        return await self._call("PUT", "/utilization", {
            "gpus": {g.uuid: g.utilization for g in snapshot.gpus if g.utilization is not None},
            "memory": {g.uuid: [g.memory_used_bytes, g.memory_total_bytes] for g in snapshot.gpus
                       if g.memory_used_bytes is not None and g.memory_used_bytes <= g.memory_total_bytes},
            "users": {g.uuid: {u: v for u, v in g.users.items() if v is not None} for g in snapshot.gpus
                      if g.attribution_ok}})

    async def report_attribution(self, snapshot: Snapshot) -> Any:
        """Which GPUs' use the agent cannot attribute, and why (the admins' pool map)."""
        return await self._call("PUT", "/attribution", {"gpus": {g.uuid: g.why_not() for g in snapshot.gpus}})
