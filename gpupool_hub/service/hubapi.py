"""A small async client for the JupyterHub REST API, as the service uses it.

Pagination and bounded concurrency as in jupyterhub-idle-culler; usernames
and server names are always URL-quoted, never put into a shell.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger("gpupool.hub")


class HubError(RuntimeError):
    pass


def _q(name: str) -> str:
    return quote(name, safe="")


class HubClient:
    def __init__(self, api_url: str, token: str, *, concurrency: int = 10, timeout: float = 20) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._sem = asyncio.Semaphore(concurrency)

    async def request(self, method: str, path: str, body: Any = None, *, params: dict | None = None,  # type: ignore[type-arg]
                      allow_404: bool = False, url: str | None = None) -> Any:
        target = url or f"{self.api_url}{path}"
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
            try:
                resp = await AsyncHTTPClient().fetch(req)
            except HTTPClientError as e:
                if allow_404 and e.code == 404:
                    return None
                detail = e.response.body.decode("utf8", "replace")[:300] if e.response is not None else ""
                raise HubError(f"{method} {target}: HTTP {e.code} {detail}") from None
            except OSError as e:
                raise HubError(f"{method} {target}: {e}") from None
        if not resp.body:
            return None
        return json.loads(resp.body)

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
