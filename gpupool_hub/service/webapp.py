"""The tornado application of the service: routes plus one typed context.

The service builds it from its configuration (``GPUPoolService.make_context``);
tests build it with their own parts (a stub token checker, no hub). Both call
:func:`make_app`, so what is tested is what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tornado import web

from .api import MAX_BODY_SIZE, NotFoundHandler, routes
from .common.context import ServiceContext
from .pages import page_routes

__all__ = ["MAX_BODY_SIZE", "make_app"]


def make_app(context: ServiceContext, *, log_function: Callable[[web.RequestHandler], None] | None = None,
             **tornado_settings: Any) -> web.Application:
    settings: dict[str, Any] = {"context": context, "cookie_secret": context.cookie_secret,
                                "default_handler_class": NotFoundHandler, **tornado_settings}
    if log_function is not None:
        settings["log_function"] = log_function
    return web.Application(routes(context.prefix) + page_routes(context.prefix), **settings)
