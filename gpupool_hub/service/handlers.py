"""REST API of the gpupool service, under ``{prefix}api/v1/``.

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

import csv
import hmac
import io
import json
import logging
import re
import time
from collections.abc import Callable
from decimal import Decimal
from importlib import resources
from itertools import islice
from typing import Any, TypeVar

from tornado import web

from ..ledger import (UNAVAILABLE_MESSAGE, Entry, IdempotencyConflict, LedgerBusy, is_database_busy,
                      is_database_unavailable)
from ..units import AmountError, format_tokens, parse_amount
from ..timefmt import iso as _iso
from .admission import parse_request
from .attempts import KEY_MAX_LENGTH, AttemptAbandoned, parse_instant
from .catalog import catalog as models_catalog
from .context import ServiceContext
from .errors import BadRequest, Refused
from .httpargs import QueryArgs
from .hubapi import HubError
from .manager import PoolManager

log = logging.getLogger("gpupool.api")

MAX_PAGE = 500

T = TypeVar("T")

#: JSON bodies are flat objects with a list or an object inside; deeper nesting is refused
MAX_JSON_DEPTH = 8

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

#: what no text from a request may contain: control characters (C0, DEL, C1) and lone surrogates
UNSAFE_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def text_problem(value: str, *, max_length: int, allow_empty: bool = False) -> str | None:
    """What is wrong with a piece of text from a request, or None: lone surrogates
    (unstorable), control characters (log and CSV injection), absurd lengths."""
    if not value and not allow_empty:
        return "must not be empty"
    if len(value) > max_length:
        return f"must be at most {max_length} characters"
    bad = UNSAFE_CHARACTER.search(value)
    if bad is None:
        return None
    if 0xD800 <= ord(bad.group()) <= 0xDFFF:
        return "contains a lone surrogate (not valid Unicode text)"
    return f"contains the control character U+{ord(bad.group()):04X}"


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, or 400: not UTF-8, not JSON, nested deeper than
    ``MAX_JSON_DEPTH``, or a string (or key) that is not clean text."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise web.HTTPError(400, "request body is not UTF-8") from None
    except RecursionError:
        raise web.HTTPError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as e:
        raise web.HTTPError(400, f"request body is not valid JSON: {e}") from None
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise web.HTTPError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, depth + 1))
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            problem = text_problem(value, max_length=100_000, allow_empty=True)
            if problem:
                raise web.HTTPError(400, f"a string in the request body {problem}")
    return body


def entry_json(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id, "kind": e.kind, "amount": format_tokens(e.amount), "reason": e.reason, "actor": e.actor,
        "created_at": _iso(e.created_at), "interval_start": _iso(e.interval_start),
        "interval_end": _iso(e.interval_end), "model": e.model,
        "gpu_seconds": None if e.gpu_seconds is None else str(e.gpu_seconds),
    }


@web.stream_request_body
class APIHandler(QueryArgs):
    """JSON in, JSON out, hub-token authentication in ``prepare``.

    Bodies are streamed (``stream_request_body``): ``prepare`` authenticates
    the caller before a single byte of the body is read, and ``data_received``
    keeps at most ``max_body_bytes`` (413 past it). An unauthenticated upload
    costs the service nothing but the bytes it discards.
    """

    identity: dict[str, Any]

    #: the largest request body this endpoint reads, in bytes; larger bodies get 413
    max_body_bytes = 4 * 1024

    _body: bytearray
    #: the answer to give once the body is drained (set in prepare, or when the body is too large)
    _refusal: web.HTTPError | None = None
    #: prepare finished: the body will be read (an error before that leaves it unread)
    _prepared = False
    #: when this request's writes give up (``time.monotonic()``), set by its first write
    _write_deadline: float | None = None

    @property
    def context(self) -> ServiceContext:
        return self.settings["context"]

    @property
    def manager(self) -> PoolManager:
        return self.settings["context"].manager

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    async def core(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a core call that may write on the core's writer thread (never on the event loop).

        All the writes of one request share one deadline, ``db_write_timeout`` after
        the first: a grant (open the account, then post) answers 503 within it, not twice it."""
        threads = self.manager.threads
        if self._write_deadline is None:
            self._write_deadline = threads.deadline()
        return await threads.write_until(self._write_deadline, fn, *args, **kwargs)

    async def read_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a call that only reads the database on a reader thread."""
        return await self.manager.threads.read(fn, *args, **kwargs)

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
        body = parse_json(bytes(self._body) or b"{}")
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        return body

    # ---- path and query arguments (tornado has URL-decoded path arguments once already)

    def path_name(self, value: str, what: str = "user name") -> str:
        """A user, node or allocation name from the path, as sent (decoded once, by tornado)."""
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
        """Every error as ``{"status": N, "message": "…"}``; a busy database is 503 with Retry-After."""
        message = kwargs.get("message") or self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        retry_after = BUSY_RETRY_AFTER
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif exc is not None and is_database_busy(exc):
            status_code = 503
            self.set_status(status_code)
            retry_after = exc.retry_after if isinstance(exc, LedgerBusy) else BUSY_RETRY_AFTER
            message = (f"the ledger database is busy: {exc}; nothing was changed, try again in {retry_after} s"
                       if isinstance(exc, LedgerBusy) else
                       f"the ledger database is busy; nothing was changed, try again in {retry_after} s")
        elif exc is not None and is_database_unavailable(exc):
            status_code = 503
            self.set_status(status_code)
            message = UNAVAILABLE_MESSAGE
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

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        if value is not None and is_database_busy(value):
            log.warning("Database busy, answered 503: %s %s: %s", self.request.method, self.request.path, value)
            return
        if value is not None and is_database_unavailable(value):
            log.error("Database unreachable, answered 503: %s %s: %s", self.request.method, self.request.path,
                      getattr(value, "orig", value))
            return
        super().log_exception(typ, value, tb)

    def on_finish(self) -> None:
        metrics = self.context.metrics
        if metrics is not None and hasattr(self, "_started"):
            metrics.api_latency.labels(type(self).__name__, self.request.method, str(self.get_status())).observe(
                time.perf_counter() - self._started
            )


class RootHandler(APIHandler):
    max_body_bytes = 0

    async def authenticate(self) -> None:  # public: tells clients what this is
        self.identity = {"kind": "anonymous", "name": "", "scopes": [], "groups": []}

    def get(self) -> None:
        from .. import __version__

        self.write_json({"service": "gpupool", "version": __version__, "openapi": "openapi.json"})


class OpenAPIHandler(RootHandler):
    def get(self) -> None:
        self.finish(resources.files("gpupool_hub.service").joinpath("openapi.json").read_text())


class NotFoundHandler(RootHandler):
    """Every path no route matches: a JSON 404, before any body is read, whoever asks."""

    async def authenticate(self) -> None:
        raise web.HTTPError(404, f"no such endpoint: {self.request.method} {self.request.path}; "
                                 f"the API is described in {self.context.prefix.rstrip('/')}/api/v1/openapi.json")


class MeHandler(APIHandler):
    async def get(self) -> None:
        user = self.require_user()
        self.write_json(await self.manager.views.serve_me(user, await self.groups_of(user)))


class HistoryHandler(APIHandler):
    async def get(self, name: str | None = None) -> None:
        if name is None:
            user = self.require_user()
        else:
            self.require_admin()
            user = self.path_name(name)
            if not await self.known_user(user):
                raise web.HTTPError(404, f"no such user {user!r}")
        limit = self.int_arg("limit", 50, minimum=1, maximum=MAX_PAGE)
        before = self.int_arg("before", None, minimum=1)
        rows = await self.read_db(self.manager.ledger.history, user, limit=limit, before=before)  # type: ignore[arg-type]
        nxt = rows[-1].id if len(rows) == limit else None
        self.write_json({"user": user, "entries": [entry_json(e) for e in rows], "next_before": nxt})


class UsersHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        after = self.text_arg("after")
        rows = await self.read_db(self.manager.ledger.accounts, limit=limit, after=after)  # type: ignore[arg-type]
        self.write_json({
            "users": [{"name": a.name, "balance": format_tokens(a.balance)} for a in rows],
            "next_after": rows[-1].name if len(rows) == limit else None,
        })


class UserHandler(APIHandler):
    async def get(self, name: str) -> None:
        self.require_spawner_or_admin()  # the spawner shows the balance on the options form
        user = self.path_name(name)
        if not await self.known_user(user):
            raise web.HTTPError(404, f"no such user {user!r}")
        self.write_json(await self.manager.views.serve_me(user, await self.groups_of(user)))


class GrantHandler(APIHandler):
    max_body_bytes = 16 * 1024

    async def post(self, name: str) -> None:
        self.require_admin()
        user = self.path_name(name)
        body = self.json_body()
        unknown = sorted(set(body) - {"amount", "reason"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {unknown}; a grant takes 'amount' and 'reason'")
        if "amount" not in body:
            raise web.HTTPError(400, "a grant needs an 'amount'")
        if isinstance(body["amount"], float):
            raise web.HTTPError(400, "send 'amount' as a string or integer (e.g. \"12.5\") so it stays exact")
        try:
            amount = parse_amount(body["amount"], what="amount", places=3)
        except AmountError as e:
            raise web.HTTPError(400, str(e)) from None
        limit = self.context.max_grant
        if amount == 0 or abs(amount) > limit:
            raise web.HTTPError(400, f"amount must be non-zero and at most {limit} tokens either way, got {amount}")
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 1000:
            raise web.HTTPError(400, "a grant needs a 'reason' (a non-empty string of at most 1000 characters)")
        key = self.request.headers.get("Idempotency-Key")
        if key is not None and text_problem(key, max_length=200):
            raise web.HTTPError(400, f"Idempotency-Key {text_problem(key, max_length=200)}")
        if not await self.known_user(user):
            raise web.HTTPError(404, f"no such user {user!r}")
        await self.core(self.manager.accounts.ensure, user, await self.groups_of(user))
        try:
            entry, created = await self.core(self.manager.accounts.grant, user, amount, reason.strip(),
                                             self.identity["name"], key)
        except IdempotencyConflict:
            raise web.HTTPError(409, f"Idempotency-Key {key!r} was already used for a different grant") from None
        balance = await self.read_db(self.manager.ledger.balance, user)
        self.write_json({"entry": entry_json(entry), "created": created,
                         "balance": format_tokens(balance)}, 201 if created else 200)


class PoolHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        active = {r.id: r for r in await self.read_db(self.manager.ledger.active_allocations)}
        nodes = await self.core(self.manager.pool.snapshot)

        idle = self.manager.idle.idle_since()  # as of the idle job's last run

        def holders(held: dict[str, int]) -> list[dict[str, Any]]:
            return [{"allocation": a, "fraction": format_tokens(Decimal(m) / 1000),
                     "user": active[a].user if a in active else None,
                     "server": active[a].server if a in active else None,
                     **({"idle_since": _iso(idle[a])} if a in idle else {})}
                    for a, m in held.items()]

        for node in nodes:
            for gpu in node["gpus"]:
                gpu["allocated_fraction"] = format_tokens(Decimal(gpu.pop("allocated_milli")) / 1000)
                gpu["holders"] = holders(gpu["holders"])
                for instance in gpu.get("mig", ()):  # MIG instances inside their GPU, each with its holder
                    instance["fraction"] = format_tokens(Decimal(instance.pop("milli")) / 1000)
                    instance["holders"] = holders(instance["holders"])
        inv = self.manager.inventory
        for node in nodes:  # placeholders of the inventory source (Slurm): not servers'
            node["held_outside"] = list(inv.held_outside.get(node["node"], []))
            if node["node"] in inv.unavailable:
                node["unavailable"] = inv.unavailable[node["node"]]
            for gpu in node["gpus"]:
                for h in gpu["holders"]:
                    if inv.is_outside(h["allocation"]):
                        h["held_outside"] = True
        free = await self.core(self.manager.pool.free_summary)
        teams = await self.core(self.manager.reclaims.team_report)
        self.write_json({"nodes": nodes, "free": free.as_dict(),
                         "unallocated_servers": self.context.reconcile_report(),
                         "teams": teams["teams"]})


class ModelsHandler(APIHandler):
    """The GPU models of the pool with their prices and what is free: what the
    spawn form shows. Any caller of the service may read it (prices are public
    within the hub); the pool itself, not ``c.GPUPool.nodes``, is the source."""

    async def get(self) -> None:
        catalog = await self.core(models_catalog, self.manager.inventory, self.manager.settings.min_start_hours)
        waiting = await self.core(self.manager.queue.cached_summary)
        for entry in catalog["models"]:  # "full — 2 waiting, about 20 min" on the spawn form
            entry.update(waiting.get(entry["model"], {"waiting": 0, "eta": None}))
        self.write_json(catalog)


class QueueHandler(APIHandler):
    """The wait queue: the admins' view (GET), and a cancelled spawn giving up its place (DELETE)."""

    max_body_bytes = 0

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.core(self.manager.queue.report))

    async def delete(self) -> None:
        self.require_spawner_or_admin()
        user = self.text_arg("user")
        if not user:
            raise web.HTTPError(400, "'user' (the waiting server's user) is required")
        server = self.text_arg("server", "") or ""
        self.write_json({"left": await self.core(self.manager.queue.leave, user, server)})


class TeamsHandler(APIHandler):
    """Fair share: per team quota, usage, borrowed GPUs; reclaims in progress (admins)."""

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.core(self.manager.reclaims.team_report))


class VerifyHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        report = await self.read_db(self.manager.ledger.verify)
        self.write_json({
            "ok": report.ok, "accounts": report.accounts, "entries": report.entries,
            "mismatches": [{"user": m.account, "stored": format_tokens(m.stored), "computed": format_tokens(m.computed)}
                           for m in report.mismatches],
        })


class ExportHandler(APIHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    async def get(self) -> None:
        self.require_admin()
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["id", "user", "kind", "amount", "created_at", "interval_start", "interval_end",
                         "model", "gpu_seconds", "reason", "actor", "idempotency_key"])
        entries = self.manager.ledger.iter_entries()
        while batch := await self.read_db(lambda: list(islice(entries, 1000))):
            for e in batch:
                writer.writerow([e.id, e.account, e.kind, format_tokens(e.amount), _iso(e.created_at),
                                 _iso(e.interval_start), _iso(e.interval_end), e.model or "", e.gpu_seconds or "",
                                 e.reason, e.actor, e.key])
            self.write(buf.getvalue())
            buf.seek(0)
            buf.truncate()
            await self.flush()
        self.write(buf.getvalue())
        self.finish()


class AllocationsHandler(APIHandler):
    max_body_bytes = 64 * 1024

    async def get(self) -> None:
        self.require_spawner_or_admin()
        views = self.manager.views
        active = await self.read_db(self.manager.ledger.active_allocations)
        self.write_json({"allocations": [views.allocation_json(r) for r in active]})

    async def post(self) -> None:
        self.require_spawner_or_admin()
        body = self.json_body()
        unknown = sorted(set(body) - {"user", "server", "request", "groups", "key"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {unknown}; expected user, server, request, groups, key")
        key = body.get("key")
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= KEY_MAX_LENGTH):
            raise web.HTTPError(400, f"'key' must be the spawn attempt's key, 1-{KEY_MAX_LENGTH} characters")
        user, server = body.get("user"), body.get("server", "")
        if not isinstance(user, str) or not user or len(user) > 255:
            raise web.HTTPError(400, "'user' must be a JupyterHub username")
        if not isinstance(server, str) or len(server) > 255:
            raise web.HTTPError(400, "'server' must be a server name ('' for the default server)")
        groups = body.get("groups")
        if groups is not None and not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
            raise web.HTTPError(400, "'groups' must be a list of group names")
        request = body.get("request")
        try:
            req = parse_request(request)
        except BadRequest as e:
            raise web.HTTPError(400, f"invalid request: {e}") from None
        models = request.get("models") if isinstance(request, dict) else None
        if groups is None:
            groups = await self.groups_of(user)
        try:
            record = await self.core(self.manager.admission.admit, user, groups, server, req, models, key=key)
        except BadRequest as e:
            raise web.HTTPError(400, str(e)) from None
        except AttemptAbandoned as e:
            self.write_json({"allocated": False, "reason": "abandoned", "message": str(e)}, 410)
            return
        except Refused as e:
            self.write_json({"allocated": False, **e.as_dict()}, 409)
            return
        self.write_json({"allocated": True, "allocation": self.manager.views.allocation_json(record)}, 201)


class AllocationHandler(APIHandler):
    async def get(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        record = await self.read_db(self.manager.ledger.allocation, self.path_name(alloc_id, "allocation id"))
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})

    async def delete(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        reason = self.text_arg("reason", "server stopped", max_length=1000)[:200]  # type: ignore[index]
        at = self.text_arg("at")  # when the server stopped, for a release that comes late
        try:
            stopped = parse_instant(at) if at is not None else None
        except ValueError as e:
            raise web.HTTPError(400, f"'at' must be an ISO 8601 instant: {e}") from None
        record = await self.core(self.manager.admission.release, self.path_name(alloc_id, "allocation id"), reason,
                                 at=stopped)
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})

    max_body_bytes = 16 * 1024

    async def patch(self, alloc_id: str) -> None:
        """The spawner records the GPU indices a batch scheduler really bound (gpupool-slurm)."""
        if not self.is_spawner:
            raise web.HTTPError(403, "only the hub's spawner records the GPUs a job was bound to")
        body = self.json_body()
        unknown = sorted(set(body) - {"gpu_indices"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {unknown}; send 'gpu_indices'")
        indices = body.get("gpu_indices")
        if (not isinstance(indices, list) or not indices or len(indices) > 64
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024 for i in indices)):
            raise web.HTTPError(400, "'gpu_indices' must be a non-empty list of GPU indices (integers 0-1023)")
        try:
            record = await self.core(self.manager.inventory.rebind, self.manager.ledger,
                                     self.path_name(alloc_id, "allocation id"), indices)
        except LookupError:
            raise web.HTTPError(404, f"no held allocation {alloc_id!r}") from None
        except ValueError as e:
            raise web.HTTPError(409, str(e)) from None
        self.write_json({"allocation": self.manager.views.allocation_json(record)})


class ReclaimsHandler(APIHandler):
    """The spawner gives up a spawn that waits for a reclaim: its victims keep their GPUs."""

    async def delete(self) -> None:
        self.require_spawner_or_admin()
        user = self.text_arg("user")
        if not user:
            raise web.HTTPError(400, "'user' is required")
        server = self.text_arg("server", "") or ""
        why = self.text_arg("reason", "the spawn was cancelled", max_length=1000)[:200]  # type: ignore[index]
        cancelled = await self.core(self.manager.reclaims.cancel_pending, user, server, why)
        self.write_json({"cancelled": cancelled})


class AllocationByKeyHandler(APIHandler):
    """``DELETE /allocations/by-key/{key}``: the spawner gave up on a spawn attempt."""

    async def delete(self, key: str) -> None:
        self.require_spawner_or_admin()
        key = self.path_name(key, "spawn attempt key")
        if not 0 < len(key) <= KEY_MAX_LENGTH:
            raise web.HTTPError(400, f"a spawn attempt's key has 1-{KEY_MAX_LENGTH} characters")
        reason = self.text_arg("reason", "spawn abandoned", max_length=1000)[:200]  # type: ignore[index]
        record = await self.core(self.manager.admission.release_key, key, reason)
        views = self.manager.views
        self.write_json({"allocation": views.allocation_json(record) if record is not None else None})


class AuditHandler(APIHandler):
    """Every cull action with its reason (admins)."""

    async def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        before = self.int_arg("before", None, minimum=1)
        user = self.text_arg("user")
        events = await self.read_db(self.manager.ledger.audit_log, limit=limit, before=before, user=user)  # type: ignore[arg-type]
        self.write_json({
            "events": [{"id": e.id, "at": _iso(e.at), "user": e.user, "server": e.server, "action": e.action,
                        "reason": e.reason, "dry_run": e.dry_run, "detail": e.detail} for e in events],
            "next_before": events[-1].id if len(events) == limit else None,
        })


class MetricsHandler(APIHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    async def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        scopes = set(self.identity.get("scopes", []))
        if not (self.is_admin or self.is_spawner or "read:metrics" in scopes):
            raise web.HTTPError(403, "metrics need the admin scope or read:metrics")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(await self.core(generate_latest, self.context.metrics.registry))  # type: ignore[union-attr]


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix.rstrip("/") + "/api/v1"
    name = r"([^/]+)"
    return [
        (rf"{api}/?", RootHandler),
        (rf"{api}/openapi.json", OpenAPIHandler),
        (rf"{api}/me", MeHandler),
        (rf"{api}/me/history", HistoryHandler),
        (rf"{api}/users", UsersHandler),
        (rf"{api}/users/{name}", UserHandler),
        (rf"{api}/users/{name}/history", HistoryHandler),
        (rf"{api}/users/{name}/grant", GrantHandler),
        (rf"{api}/pool", PoolHandler),
        (rf"{api}/teams", TeamsHandler),
        (rf"{api}/models", ModelsHandler),
        (rf"{api}/queue", QueueHandler),
        (rf"{api}/ledger/verify", VerifyHandler),
        (rf"{api}/ledger/export", ExportHandler),
        (rf"{api}/audit", AuditHandler),
        (rf"{api}/allocations", AllocationsHandler),
        (rf"{api}/reclaims", ReclaimsHandler),
        (rf"{api}/allocations/by-key/{name}", AllocationByKeyHandler),
        (rf"{api}/allocations/{name}", AllocationHandler),
        (rf"{prefix.rstrip('/')}/metrics", MetricsHandler),
    ]
