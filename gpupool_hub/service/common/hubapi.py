"""A small async client for the JupyterHub REST API, as the service uses it.

Pagination and bounded concurrency as in jupyterhub-idle-culler; usernames
and server names are always URL-quoted, never put into a shell.

The service's hub token goes to the hub's API (``api_url``) and nowhere else:
``request`` takes a path under it, never a URL. Where the service must call a
user's own server, ``server_token`` mints a short-lived token owned by that
user and scoped to that one server (see ``service/jobs/userserver.py``), because
the user's code runs there and can read every header the server receives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ... import strictjson

log = logging.getLogger("gpupool.hub")
group_log = logging.getLogger("gpupool.groups")


class HubError(RuntimeError):
    pass


def _q(name: str) -> str:
    return quote(name, safe="")


#: seconds a token for one user server lives: one kernel cull needs a few requests
SERVER_TOKEN_EXPIRES_IN = 300


def server_scope(user: str, server: str) -> str:
    """The scope that reaches ``user``'s server ``server`` (``""``: the default one) and nothing else."""
    return f"access:servers!server={user}/{server}"


async def fetch_json(req: HTTPRequest, *, allow_404: bool = False) -> Any:
    """Send ``req``; its JSON answer (None for an empty one, or a 404 when allowed), else :class:`HubError`."""
    what = f"{req.method} {req.url}"
    try:
        resp = await AsyncHTTPClient().fetch(req)
    except HTTPClientError as e:
        if allow_404 and e.code == 404:
            return None
        detail = e.response.body.decode("utf8", "replace")[:300] if e.response is not None else ""
        raise HubError(f"{what}: HTTP {e.code} {detail}") from None
    except OSError as e:
        raise HubError(f"{what}: {e}") from None
    if not resp.body:
        return None
    return strictjson.loads(resp.body)


class HubClient:
    def __init__(self, api_url: str, token: str, *, concurrency: int = 10, timeout: float = 20) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._sem = asyncio.Semaphore(concurrency)

    async def request(self, method: str, path: str, body: Any = None, *, params: dict | None = None,  # type: ignore[type-arg]
                      allow_404: bool = False) -> Any:
        """Call the hub's API at ``path`` (under ``api_url``) with the service's token."""
        if not path.startswith("/"):  # "@host" or ".evil" after api_url would send the token elsewhere
            raise ValueError(f"hub API path must start with '/': {path!r}")
        target = f"{self.api_url}{path}"
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        req = HTTPRequest(
            target, method=method,
            headers={"Authorization": f"token {self.token}", "Accept": "application/jupyterhub-pagination+json",
                     "Content-Type": "application/json"},
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            request_timeout=self.timeout, allow_nonstandard_methods=True,
        )
        async with self._sem:
            return await fetch_json(req, allow_404=allow_404)

    async def users(self, *, state: str | None = None, page: int = 200) -> AsyncIterator[dict]:  # type: ignore[type-arg]
        """Every hub user, page by page (``state="active"`` for users with running servers)."""
        offset = 0
        while True:
            params: dict[str, Any] = {"offset": offset, "limit": page, "include_stopped_servers": "0"}
            if state:
                params["state"] = state
            data = await self.request("GET", "/users", params=params)
            items = data["items"] if isinstance(data, dict) else data
            for item in items:
                yield item
            nxt = data.get("_pagination", {}).get("next") if isinstance(data, dict) else None
            if not nxt or not items:
                return
            offset = nxt["offset"]

    async def user(self, name: str) -> dict | None:  # type: ignore[type-arg]
        return await self.request("GET", f"/users/{_q(name)}", allow_404=True)

    async def stop_server(self, name: str, server: str = "") -> None:
        path = f"/users/{_q(name)}/servers/{_q(server)}" if server else f"/users/{_q(name)}/server"
        await self.request("DELETE", path, allow_404=True)

    @asynccontextmanager
    async def server_token(self, user: str, server: str, note: str,
                           expires_in: int = SERVER_TOKEN_EXPIRES_IN) -> AsyncIterator[str]:
        """A token owned by ``user`` that reaches only their server ``server`` and expires in
        ``expires_in`` seconds; deleted when the block ends. The hub refuses it (HubError)
        unless the user may access that server and the service holds the ``tokens`` scope."""
        body = {"scopes": [server_scope(user, server)], "expires_in": expires_in, "note": note}
        model = await self.request("POST", f"/users/{_q(user)}/tokens", body)
        try:
            yield model["token"]
        finally:
            try:
                await self.request("DELETE", f"/users/{_q(user)}/tokens/{_q(model['id'])}", allow_404=True)
            except HubError as e:  # it expires by itself within minutes
                log.warning("Could not delete the server token %s of %s: %s", model["id"], user, e)


class GroupCache:
    """Users' hub groups, cached for a minute: credit rules and teams depend on them,
    and asking the hub on every ``GET me`` would make the hub the bottleneck."""

    def __init__(self, hub: HubClient, max_age: float = 60) -> None:
        self.hub = hub
        self.max_age = max_age
        self._groups: dict[str, tuple[float, list[str]]] = {}

    def remember(self, user: str, groups: Iterable[str]) -> None:
        self._groups[user] = (time.monotonic(), list(groups))

    async def __call__(self, user: str) -> list[str]:
        cached = self._groups.get(user)
        if cached and time.monotonic() - cached[0] < self.max_age:
            return cached[1]
        try:
            model = await self.hub.user(user)
        except HubError as e:
            group_log.warning("Cannot read groups of %s: %s", user, e)
            return cached[1] if cached else []
        groups = list((model or {}).get("groups", []))
        self.remember(user, groups)
        return groups
