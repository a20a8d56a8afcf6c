"""The REST API: one module per OpenAPI path family, each ending in ``default_handlers``."""

from __future__ import annotations

from tornado import web

from . import allocations, ledger, meta, nodes, notices, pool, users
from .base import MAX_BODY_SIZE
from .meta import NotFoundHandler

__all__ = ["MAX_BODY_SIZE", "NotFoundHandler", "default_handlers", "routes"]

default_handlers: list[tuple[str, type[web.RequestHandler]]] = []
for _module in (meta, users, allocations, pool, ledger, nodes, notices):
    default_handlers.extend(_module.default_handlers)


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    """``default_handlers`` under the service's URL prefix."""
    p = prefix.rstrip("/")
    return [(f"{p}/{path}", handler) for path, handler in default_handlers]
