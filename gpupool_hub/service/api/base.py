"""What every endpoint of the REST API (``{prefix}api/v1/``) shares: ``APIHandler``.

Authentication is JupyterHub's: a request carries a hub token (``Authorization:
token …``) that the hub resolves to a user or service with scopes. A user sees
only their own account; admin endpoints need the admin scope (default
``custom:gpupool:admin``); the spawner, inside the hub, sends a secret of its
own (``c.GPUPoolService.spawner_token``), which is no hub token. Every error
is JSON ``{"status": N, "message": "…"}``, never a 500 for bad input; unknown
paths are a JSON 404 too.

Path segments (user, node, allocation names) are URL-decoded once, by tornado.
Request bodies are streamed: the token is checked before any of the body is
read, and each handler keeps at most its ``max_body_bytes``.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from tornado import web

from ...ledger import UNAVAILABLE_MESSAGE, LedgerBusy, is_database_busy, is_database_unavailable
from ..common.context import ServiceContext
from .httpargs import QueryArgs
from ..common.hubapi import HubError
from ..core.manager import PoolManager
from ..core.threads import share_write_deadline
from .openapi import check_body, name_problem, parse_json, text_problem

log = logging.getLogger("gpupool.api")

MAX_PAGE = 500

#: the largest request body the service's HTTP server reads by default: the pages' forms, which
#: tornado reads whole. API endpoints stream theirs and keep at most their own, much smaller
#: ``max_body_bytes`` (the largest, a node's inventory, is 1 MiB), draining up to MAX_DRAINED_BODY.
MAX_BODY_SIZE = 8 * 1024 * 1024

#: how much of a refused body an API endpoint reads and drops before answering 413. The hub's
#: proxy (configurable-http-proxy) has no body limit of its own: it streams any body on, and if
#: the service closes the connection before reading it, the proxy's write fails and the client
#: gets the hub's HTML 503 instead of the service's JSON 413. Draining costs bandwidth, never
#: memory (each chunk is dropped as it arrives); past this the connection is closed after all.
MAX_DRAINED_BODY = 64 * 1024 * 1024

#: seconds a client should wait before retrying a 503 (the ledger database busy, the hub away)
BUSY_RETRY_AFTER = 2


@dataclass(frozen=True)
class DatabaseTrouble:
    """The ledger database could not answer, through no fault of the request or of the code:
    another writer held its lock (``busy``), or the server is down or unreachable.

    The API and the pages both answer it with 503 and ``Retry-After`` and log it as one
    warning line: it says when to try again, and a traceback per request while the
    database is away (every lab tab polls) would bury what an admin needs to read."""

    busy: bool
    #: seconds to put in ``Retry-After``
    retry_after: int
    #: the database's own words, for the log
    detail: str

    def log(self, logger: logging.Logger, request: Any) -> None:
        """One warning line naming the request: no traceback, the cause is not in this code."""
        what = "busy" if self.busy else "unreachable"
        logger.warning("Database %s, answered 503: %s %s: %s", what, request.method, request.path,
                       " ".join(self.detail.split()))


def database_trouble(exc: BaseException | None) -> DatabaseTrouble | None:
    """What the API and the pages make of ``exc``: database trouble (503, retry), or None for
    anything else (a bug, a refusal). The one place that tells them apart, with the ledger's
    own rules (``is_database_busy``, ``is_database_unavailable``)."""
    if exc is None:
        return None
    if is_database_busy(exc):
        retry_after = exc.retry_after if isinstance(exc, LedgerBusy) else BUSY_RETRY_AFTER
        return DatabaseTrouble(busy=True, retry_after=retry_after, detail=str(exc))
    if is_database_unavailable(exc):
        return DatabaseTrouble(busy=False, retry_after=BUSY_RETRY_AFTER, detail=str(getattr(exc, "orig", exc)))
    return None


class LogsDatabaseTrouble(web.RequestHandler):
    """A handler base (the API's and the pages') that logs database trouble as one warning
    line on ``trouble_log`` (:meth:`DatabaseTrouble.log`), and anything else as tornado does."""

    trouble_log = log

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        trouble = database_trouble(value)
        if trouble is not None:
            trouble.log(self.trouble_log, self.request)
            return
        super().log_exception(typ, value, tb)


@web.stream_request_body
class APIHandler(LogsDatabaseTrouble, QueryArgs):
    """JSON in, JSON out, hub-token authentication in ``prepare``.

    Bodies are streamed (``stream_request_body``): ``prepare`` authenticates
    the caller before a single byte of the body is read, and ``data_received``
    keeps at most ``max_body_bytes`` (413 past it). An unauthenticated upload
    costs the service nothing but the bytes it discards.
    """

    identity: dict[str, Any]

    #: the largest request body this endpoint reads, in bytes; larger bodies get 413
    max_body_bytes = 4 * 1024
    #: the endpoint's path in ``openapi.json``, whose schema its request bodies must match
    openapi_path: str | None = None

    _body: bytearray
    #: the answer to give once the body is drained (set in prepare, or when the body is too large)
    _refusal: web.HTTPError | None = None
    #: prepare finished: the body will be read (an error before that leaves it unread)
    _prepared = False

    @property
    def context(self) -> ServiceContext:
        return self.settings["context"]

    @property
    def manager(self) -> PoolManager:
        return self.settings["context"].manager

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:
        """Token-authenticated API: no cookies are honoured, so XSRF does not apply."""

    def _token(self) -> str | None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() in ("token", "bearer") and token.strip():
            return token.strip()
        return None

    async def prepare(self) -> None:
        self._started = time.perf_counter()
        share_write_deadline()  # the core writes this request awaits give up together
        self._body = bytearray()
        # read (and drop) a refused body rather than close on it; chunked ones declare no length
        self.request.connection.set_max_body_size(MAX_DRAINED_BODY)  # type: ignore[union-attr]
        try:
            await self.authenticate()
            self._check_declared_length()
        except web.HTTPError as e:
            if self._declared_length() > MAX_DRAINED_BODY:
                raise  # not worth reading: answer now (and close the connection)
            self._refuse_after_body(e)
        self._prepared = True

    async def authenticate(self) -> None:
        """Set ``self.identity`` from the request's token, or raise 401/403/503."""
        token = self._token()
        if token is None:
            raise web.HTTPError(401, "missing token: send 'Authorization: token <JupyterHub API token>'")
        spawner_token = self.context.spawner_token
        if spawner_token and hmac.compare_digest(token.encode(), spawner_token.encode()):
            self.identity = {"kind": "spawner", "name": "hub", "scopes": [], "groups": []}
            return
        hub = self.context.hub
        if hub is not None and hub.token and hmac.compare_digest(token.encode(), hub.token.encode()):
            # an old configuration's spawner, sending the service's own hub token
            raise web.HTTPError(403, "this is the gpupool service's own hub token, which no caller may use; the "
                                     "spawner sends c.GPUPoolService.spawner_token (docs/spawner.md, 'Tokens')")
        try:
            model = await self.context.hub_auth.user_for_token(token, sync=False)  # type: ignore[union-attr]
        except Exception as e:  # hub down or confused: not the caller's fault, not a 500 either
            log.error("Token check with the hub failed: %s", e)
            raise web.HTTPError(503, "cannot reach JupyterHub to check the token; try again shortly") from None
        if not model:
            raise web.HTTPError(401, "invalid or expired token")
        model.setdefault("kind", "user")
        scopes = set(model.get("scopes", []))
        access = self.context.access_scopes
        if access and not (scopes & access):
            raise web.HTTPError(403, f"token lacks the scope to use this service (one of {sorted(access)})")
        self.identity = model

    @property
    def is_admin(self) -> bool:
        return self.context.admin_scope in set(self.identity.get("scopes", []))

    @property
    def is_spawner(self) -> bool:
        return self.identity.get("kind") == "spawner"

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"this needs the {self.context.admin_scope!r} scope")

    def require_spawner_or_admin(self) -> None:
        if not (self.is_spawner or self.is_admin):
            raise web.HTTPError(403, "only the hub's spawner or an admin may manage allocations")

    def require_user(self) -> str:
        if self.identity.get("kind") != "user":
            raise web.HTTPError(400, f"'me' is a user's own view; this token belongs to a {self.identity.get('kind')}")
        if problem := name_problem(self.identity["name"]):  # GET me opens an account under that name
            raise web.HTTPError(400, f"this token's user name {problem}")
        return self.identity["name"]

    # ---- the request body: read only after authentication, never more than max_body_bytes

    def _declared_length(self) -> int:
        declared = self.request.headers.get("Content-Length", "")
        return int(declared) if declared.isdigit() else 0

    def _too_large(self) -> web.HTTPError:
        return web.HTTPError(413, f"request body larger than {self.max_body_bytes} bytes, "
                                  f"the most {self.request.method} {self.request.path} accepts")

    def _check_declared_length(self) -> None:
        if self._declared_length() > self.max_body_bytes:
            raise self._too_large()

    def _refuse_after_body(self, error: web.HTTPError) -> None:
        """Answer ``error`` instead of the method once the body has arrived, keeping none of it.

        Answering at once would make tornado close the connection with the body
        unread, which resets it before most clients (and the hub's proxy) read
        the answer; so the body is drained and dropped chunk by chunk instead.
        """
        self._refusal = error
        self._body = bytearray()

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise error

        setattr(self, self.request.method.lower(), refuse)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        if self._refusal is not None:
            return
        if len(self._body) + len(chunk) > self.max_body_bytes:  # chunked uploads declare no length
            self._refuse_after_body(self._too_large())
            return
        self._body += chunk

    def json_body(self) -> dict[str, Any]:
        """The request body, checked against ``openapi.json`` (``openapi_path``), or 400."""
        body = parse_json(bytes(self._body) or b"{}")
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        if self.openapi_path is not None:
            check_body(body, self.openapi_path, self.request.method or "")
        return body

    # ---- path and query arguments (tornado has URL-decoded path arguments once already)

    def path_name(self, value: str, what: str = "user name") -> str:
        """A user's or node's name from the path, as sent (decoded once, by tornado), or 400
        naming it and the rule: the names a body may hold are the names a path may."""
        problem = name_problem(value)
        if problem:
            raise web.HTTPError(400, f"{what} {problem}")
        return value

    def path_text(self, value: str, what: str) -> str:
        """An id or key from the path (no name: the service or the spawner made it), as sent."""
        problem = text_problem(value, max_length=255)
        if problem:
            raise web.HTTPError(400, f"{what} {problem}")
        return value

    def text_arg(self, name: str, default: str | None = None, *, max_length: int = 255) -> str | None:
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        problem = text_problem(raw, max_length=max_length, allow_empty=True)
        if problem:
            raise web.HTTPError(400, f"{name} {problem}")
        return raw

    async def groups_of(self, name: str) -> list[str]:
        if self.identity.get("kind") == "user" and self.identity.get("name") == name and "groups" in self.identity:
            return list(self.identity["groups"])
        if self.context.groups is None:
            return []
        return await self.context.groups(name)

    async def known_user(self, name: str) -> bool:
        try:
            return await self.context.known_user(name)
        except HubError as e:
            raise web.HTTPError(503, f"cannot reach JupyterHub to look up {name!r}: {e}") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as ``{"status": N, "message": "…"}``; database trouble is 503 with Retry-After."""
        message = kwargs.get("message") or self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        trouble = database_trouble(exc)
        retry_after = BUSY_RETRY_AFTER
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif trouble is not None:
            status_code, retry_after = 503, trouble.retry_after
            self.set_status(status_code)
            message = UNAVAILABLE_MESSAGE if not trouble.busy else (
                f"the ledger database is busy (another writer holds its lock); nothing was changed, "
                f"try again in {retry_after} s")
        elif status_code >= 500:
            message = "internal error in the gpupool service; see its log"
        if status_code == 503:  # the hub or the database is busy or away, not the caller wrong
            self.set_header("Retry-After", str(retry_after))
        self.set_allow_header(status_code)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        if not self._prepared:  # answered before the body was read: tornado closes the connection
            self.set_header("Connection", "close")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def on_finish(self) -> None:
        metrics = self.context.metrics
        if metrics is not None and hasattr(self, "_started"):
            metrics.api_latency.labels(type(self).__name__, self.request.method, str(self.get_status())).observe(
                time.perf_counter() - self._started
            )
