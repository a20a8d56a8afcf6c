"""``api/v1/`` itself, ``openapi.json``, ``/metrics`` and the JSON 404 of unknown paths."""

from __future__ import annotations

from importlib import resources

from tornado import web

from .base import APIHandler


class RootHandler(APIHandler):
    max_body_bytes = 0

    async def authenticate(self) -> None:  # public: tells clients what this is
        self.identity = {"kind": "anonymous", "name": "", "scopes": [], "groups": []}

    def get(self) -> None:
        from ... import __version__

        self.write_json({"service": "gpupool", "version": __version__, "openapi": "openapi.json"})


class OpenAPIHandler(RootHandler):
    def get(self) -> None:
        self.finish(resources.files("gpupool_hub.service").joinpath("openapi.json").read_text())


class NotFoundHandler(RootHandler):
    """Every path no route matches: a JSON 404, before any body is read, whoever asks."""

    async def authenticate(self) -> None:
        raise web.HTTPError(404, f"no such endpoint: {self.request.method} {self.request.path}; "
                                 f"the API is described in {self.context.prefix.rstrip('/')}/api/v1/openapi.json")


class MetricsHandler(APIHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    async def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        scopes = set(self.identity.get("scopes", []))
        if not (self.is_admin or self.is_spawner or "read:metrics" in scopes):
            raise web.HTTPError(403, "metrics need the admin scope or read:metrics")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(await self.context.metrics.exposition.off_loop())  # type: ignore[union-attr]


default_handlers = [
    (r"api/v1/?", RootHandler),
    (r"api/v1/openapi.json", OpenAPIHandler),
    (r"metrics", MetricsHandler),
]
