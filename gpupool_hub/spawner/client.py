"""The spawner's client for the gpupool service's REST API.

One place knows the service's paths, sends the token and turns answers into
values or exceptions: ``allocate`` returns an allocation or raises
:class:`~gpupool_hub.spawner.errors.GPUPoolRefused` worded for the user (the
pool's :class:`~gpupool_hub.reasons.RefusalReason` gives status and title);
the other calls return the service's JSON or raise :class:`ServiceUnavailable`
(no answer) or :class:`ServiceError` (an answer that is not a success).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets.config import LazyConfigValue

from .. import strictjson
from ..reasons import RefusalReason
from .errors import GPUPoolRefused, SpawnFailure

__all__ = [
    "DEFAULT_API_URL", "GPUPoolClient", "ServiceError", "ServiceUnavailable", "allocation_refusal",
    "api_url_from_config",
]

DEFAULT_API_URL = "http://127.0.0.1:10101/services/gpupool/api/v1"
GENERIC_TITLE = "Refused by the GPU pool"  # a reason this version does not know (a newer service)
UNKNOWN_REASON_STATUS = 409
UNNAMED_REASON = "refused"  # a 409 that names no reason


class ServiceUnavailable(Exception):
    """The gpupool service did not answer (connection refused, timeout)."""


class ServiceError(Exception):
    """The service answered, but not with success."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if message else f"HTTP {status}")
        self.status = status
        self.message = message


# ------------------------------------------------------ where the service is


def _services_entry(config: Any, service_name: str) -> dict[str, Any] | None:
    try:
        services = config.get("JupyterHub", {}).get("services", [])
        if isinstance(services, LazyConfigValue):
            services = services.get_value([])
    except Exception:  # an odd config object: fall back to the other sources
        return None
    for entry in services or []:
        if isinstance(entry, Mapping) and entry.get("name") == service_name:
            return dict(entry)
    return None


def api_url_from_config(config: Any, service_name: str) -> str:
    """The service's own URL from its ``c.JupyterHub.services`` entry (no proxy hop), else env, else default."""
    entry = _services_entry(config, service_name)
    if entry and entry.get("url"):
        base_url = config.get("JupyterHub", {}).get("base_url", "/")
        if not isinstance(base_url, str):
            base_url = "/"
        prefix = "/" + "/".join(p for p in (base_url.strip("/"), "services", service_name) if p)
        return str(entry["url"]).rstrip("/") + prefix + "/api/v1"
    return os.environ.get("GPUPOOL_API_URL") or DEFAULT_API_URL


# ------------------------------------------------------------------ refusals


def allocation_refusal(status: int, data: Any, what: str) -> GPUPoolRefused:
    """The exception for a ``POST /allocations`` answer other than 201, worded for the user.

    ``what`` is the request in words ("2 GPUs (RTX 3090)"). A 409 carries the
    pool's reason: its :class:`RefusalReason` sets the HTTP status and title;
    a reason this version does not know (from a newer service) is a 409 with a
    generic title, its message still shown.
    """
    data = data if isinstance(data, Mapping) else {}
    if status == 409:
        name = str(data.get("reason") or UNNAMED_REASON)
        known = RefusalReason.parse(name)
        message = str(data.get("message") or f"The GPU pool refused {what}.")
        title = known.title if known else GENERIC_TITLE
        return GPUPoolRefused(
            message, reason=name, status_code=known.status if known else UNKNOWN_REASON_STATUS,
            message_html=f"<strong>{html.escape(title)}.</strong> {html.escape(message)}",
            details=data.get("details"), retry_at=data.get("retry_at"),
        )
    detail = str(data.get("message") or "")[:300]
    if status in (401, 403):
        return GPUPoolRefused(
            "The hub is not allowed to use the GPU pool service (misconfigured token); please tell an admin.",
            reason=SpawnFailure.AUTH, status_code=500,
        )
    if status == 400:
        return GPUPoolRefused(f"The GPU pool cannot place {what}: {detail}", reason=SpawnFailure.BAD_REQUEST,
                              status_code=400)
    return GPUPoolRefused(
        f"The GPU pool service failed (HTTP {status}); no GPU server can start right now. Try again shortly.",
        reason=SpawnFailure.UNREACHABLE, status_code=503,
    )


def unreachable_refusal(what: str) -> GPUPoolRefused:
    """GPU profiles fail closed: no answer from the service means no GPUs."""
    return GPUPoolRefused(
        f"The GPU pool service is not reachable right now, so no GPU server can start "
        f"(requested {what}). Try again in a minute, or choose a CPU-only profile.",
        reason=SpawnFailure.UNREACHABLE, status_code=503,
    )


# -------------------------------------------------------------------- client


class GPUPoolClient:
    """Calls to the service's API at ``api_url`` (ends in ``/api/v1``) with the spawner's token."""

    def __init__(self, api_url: str, token: str = "", timeout: float = 10,
                 log: logging.Logger | logging.LoggerAdapter | None = None) -> None:  # type: ignore[type-arg]
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.log = log or logging.getLogger(__name__)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        return headers

    async def request(self, method: str, path: str, body: Any = None,
                      params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """One call: ``(status, json)``; raises :class:`ServiceUnavailable` when nothing answers."""
        url = self.api_url + path
        if params:
            url += "?" + urlencode(params)
        req = HTTPRequest(
            url, method=method, headers=self._headers(),
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.timeout, connect_timeout=self.timeout,
            allow_nonstandard_methods=True,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except HTTPClientError as e:  # pragma: no cover - raise_error=False
            resp = e.response
            if resp is None:
                raise ServiceUnavailable(str(e)) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ServiceUnavailable(str(e) or type(e).__name__) from None
        if resp.code == 599:
            raise ServiceUnavailable(str(resp.error or "no response"))
        try:
            data = strictjson.loads(resp.body) if resp.body else None
        except ValueError:
            data = {"message": resp.body[:300].decode("utf8", "replace")}
        return resp.code, data

    async def _get_object(self, path: str) -> dict[str, Any]:
        status, data = await self.request("GET", path)
        if status != 200 or not isinstance(data, dict):
            raise ServiceError(status, _message(data))
        return data

    async def ping(self) -> bool:
        """Whether the service answers at all (a CPU-only start checks this when it must not fail open)."""
        try:
            status, _ = await self.request("GET", "/")
        except ServiceUnavailable:
            return False
        return status < 500

    async def allocate(self, user: str, server: str, groups: list[str], request: Mapping[str, Any],
                       what: str, key: str | None = None, pending: bool = False) -> dict[str, Any]:
        """``POST /allocations``: the allocation, or :class:`GPUPoolRefused` saying why not.

        ``key`` names the spawn attempt: asking again with it returns the same
        allocation, and :meth:`release_key` gives up on whatever it got.
        """
        body: dict[str, Any] = {"user": user, "server": server, "groups": groups, "request": dict(request)}
        if key is not None:
            body["key"] = key
        if pending:  # a batch job: charged from when it starts (PATCH started_at)
            body["pending"] = True
        try:
            status, data = await self.request("POST", "/allocations", body)
        except ServiceUnavailable as e:
            self.log.error("gpupool service unreachable at %s: %s", self.api_url, e)
            raise unreachable_refusal(what) from None
        if status == 201 and isinstance(data, dict) and data.get("allocated"):
            return data["allocation"]
        if status in (401, 403):
            self.log.error("gpupool service rejected the spawner's token (%s): %s; the hub and the service must "
                           "read the same c.GPUPoolService.spawner_token (or spawner_token_file), and "
                           "c.GPUPoolSpawner.gpupool_api_token is best left unset", status, _message(data))
        elif status != 409 and status != 400:
            self.log.error("gpupool service answered %s to POST /allocations: %s", status, _message(data))
        raise allocation_refusal(status, data, what)

    async def release(self, allocation_id: str, reason: str, at: datetime | None = None) -> None:
        """``DELETE /allocations/{id}``; an allocation the service does not know counts as released.

        ``at`` is when the server stopped, for a release that could not be sent
        then: the service ends the charge at that time, not when it hears of it.
        """
        params = {"reason": reason[:200]}
        if at is not None:
            params["at"] = at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        status, data = await self.request("DELETE", f"/allocations/{quote(allocation_id, safe='')}", params=params)
        if status not in (200, 404):
            raise ServiceError(status, _message(data))

    async def stopping(self, allocation_id: str) -> None:
        """``PATCH /allocations/{id}`` ``{"stopping": true}``: its server was stopped, and its work is
        not yet seen to end; held (and charged) until the release. Gone already: nothing to say."""
        status, data = await self.request("PATCH", f"/allocations/{quote(allocation_id, safe='')}",
                                          {"stopping": True})
        if status not in (200, 404):
            raise ServiceError(status, _message(data))

    async def started(self, allocation_id: str, at: datetime) -> None:
        """``PATCH /allocations/{id}`` ``{"started_at": …}``: the server's batch job started then (a
        pending allocation is charged from then)."""
        stamp = at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        status, data = await self.request("PATCH", f"/allocations/{quote(allocation_id, safe='')}",
                                          {"started_at": stamp})
        if status not in (200, 404):
            raise ServiceError(status, _message(data))

    async def cancel_reclaim(self, user: str, server: str, reason: str) -> bool:
        """``DELETE /reclaims``: the spawn waiting for a reclaim is gone; True if one was cancelled."""
        status, data = await self.request("DELETE", "/reclaims",
                                          params={"user": user, "server": server, "reason": reason[:200]})
        if status != 200:
            raise ServiceError(status, _message(data))
        return bool(isinstance(data, dict) and data.get("cancelled"))

    async def release_key(self, key: str, reason: str) -> dict[str, Any] | None:
        """``DELETE /allocations/by-key/{key}``: give up on a spawn attempt; what it got is never charged."""
        status, data = await self.request(
            "DELETE", f"/allocations/by-key/{quote(key, safe='')}", params={"reason": reason[:200]}
        )
        if status != 200:
            raise ServiceError(status, _message(data))
        return data.get("allocation") if isinstance(data, dict) else None

    async def leave_queue(self, user: str, server: str) -> bool:
        """``DELETE /queue``: give up (user, server)'s place in the wait queue; whether it had one."""
        status, data = await self.request("DELETE", "/queue", params={"user": user, "server": server})
        if status != 200:
            raise ServiceError(status, _message(data))
        return bool(isinstance(data, dict) and data.get("left"))

    async def account(self, user: str) -> dict[str, Any]:
        """``GET /users/{name}``: the user's balance, floor and credits (the ``me`` view)."""
        return await self._get_object(f"/users/{quote(user, safe='')}")

    async def catalog(self) -> dict[str, Any]:
        """``GET /models``: the pool's GPU models, their prices and free GPUs, and ``min_start_hours``."""
        return await self._get_object("/models")


def _message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("message") or "")[:300]
    return "" if data is None else str(data)[:300]
