"""Calls to a user's own Jupyter server (the kernel cull), with a token for that server alone.

The user's code runs inside that server and can log every header it receives,
so nothing sent there may reach further than the server itself. Each call
carries a token the hub mints for the occasion (``HubClient.server_token``):
owned by the user, scoped to ``access:servers!server=<user>/<name>``, expiring
within minutes and deleted right after. A user who captures it gains nothing
she does not already have. The service's own hub token never goes here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tornado.httpclient import HTTPRequest

from ...takeback.cull import server_api_url
from ..common.hubapi import HubClient, fetch_json


class UserServerAPI:
    """The Jupyter Server REST API of users' servers, reached through the hub's proxy at ``public_url``."""

    def __init__(self, hub: HubClient, public_url: str, timeout: float = 20) -> None:
        self.hub = hub
        self.public_url = public_url
        self.timeout = timeout

    async def _call(self, method: str, url: str, token: str) -> Any:
        req = HTTPRequest(url, method=method, headers={"Authorization": f"token {token}"},
                          request_timeout=self.timeout, allow_nonstandard_methods=True)
        return await fetch_json(req, allow_404=True)

    async def shutdown_kernels(self, user: str, server: str) -> list[str]:
        """Shut down every kernel of the server; notebooks and files stay as they are. The ids shut down."""
        api = server_api_url(self.public_url, user, server)
        async with self.hub.server_token(user, server, "gpupool: shut down kernels (cull)") as token:
            kernels = await self._call("GET", api + "kernels", token) or []
            done = []
            for kernel in kernels:
                await self._call("DELETE", api + f"kernels/{quote(kernel['id'], safe='')}", token)
                done.append(kernel["id"])
        return done
