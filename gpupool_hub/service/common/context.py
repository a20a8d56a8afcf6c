"""Everything a request handler may use, in one typed object.

``make_app(context)`` gives it to every handler; the service and the tests
build it the same way, so a test app is the real app with other parts.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...ledger import UnknownAccount
from .hubapi import HubClient
from ..core.manager import PoolManager
from .metrics import ServiceMetrics


class TokenChecker(Protocol):
    """What handlers need of JupyterHub's HubAuth: resolve a token to a user or service model."""

    async def user_for_token(self, token: str, sync: bool = ...) -> dict[str, Any] | None: ...


@dataclass
class ServiceContext:
    manager: PoolManager
    hub_auth: TokenChecker | None
    hub: HubClient | None = None
    metrics: ServiceMetrics | None = None
    prefix: str = "/services/gpupool/"
    # the spawner's secret (no hub token; gpupool_hub/identity/spawner_token.py): the spawner, inside the hub, calls with it
    spawner_token: str = ""
    admin_scope: str = "custom:gpupool:admin"
    # a hub token needs one of these to use the service at all (empty: any hub token)
    access_scopes: set[str] = field(default_factory=set)
    max_grant: int = 1_000_000
    # per-node secrets of the node agents, and whether they only log what they would stop
    agent_tokens: dict[str, str] = field(default_factory=dict)
    agent_dry_run: bool = False
    # a user's hub groups (cached by the service); without a hub: none
    groups: Callable[[str], Awaitable[list[str]]] | None = None
    # servers that claim allocations the pool does not know, from the last reconcile
    reconcile_report: Callable[[], list[dict[str, Any]]] = lambda: []
    # the pages' hub OAuth client (a HubOAuth, see service/pages/); None: pages answer 503, the API works
    page_auth: Any = None
    # GPU utilization from node agents' reports (idle reclaim without Prometheus); None: from Prometheus
    utilization: Any = None
    # signs the pages' login and XSRF cookies; random per start (a restart only repeats the OAuth redirect)
    cookie_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    async def known_user(self, name: str) -> bool:
        """Whether ``name`` has an account, or is a hub user (who may never have logged in).

        Raises :class:`~gpupool_hub.service.common.hubapi.HubError` when the hub cannot be asked."""
        try:
            await self.manager.records.account.off_loop(name)
            return True
        except UnknownAccount:
            pass
        if self.hub is None:
            return False
        return await self.hub.user(name) is not None
