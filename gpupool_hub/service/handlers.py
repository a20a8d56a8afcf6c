"""REST API of the gpupool service, under ``{prefix}api/v1/``.

Authentication is JupyterHub's: a request carries a hub token (``Authorization:
token …``) that the hub resolves to a user or service with scopes. A user sees
only their own account; admin endpoints need the admin scope (default
``custom:gpupool:admin``); the spawner, inside the hub, uses the service's own
API token. Every error is JSON ``{"status": N, "message": "…"}``, never a 500
for bad input.
"""

from __future__ import annotations

import csv
import hmac
import io
import json
import logging
import time
from decimal import Decimal
from importlib import resources
from typing import Any

from tornado import web
from tornado.escape import url_unescape

from ..ledger import Entry, IdempotencyConflict, UnknownAccount
from ..units import AmountError, format_tokens, parse_amount
from ..timefmt import iso as _iso
from .admission import parse_request
from .attempts import KEY_MAX_LENGTH, AttemptAbandoned, parse_instant
from .context import ServiceContext
from .errors import BadRequest, Refused
from .hubapi import HubError
from .manager import PoolManager

log = logging.getLogger("gpupool.api")

MAX_PAGE = 500


def entry_json(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id, "kind": e.kind, "amount": format_tokens(e.amount), "reason": e.reason, "actor": e.actor,
        "created_at": _iso(e.created_at), "interval_start": _iso(e.interval_start),
        "interval_end": _iso(e.interval_end), "model": e.model,
        "gpu_seconds": None if e.gpu_seconds is None else str(e.gpu_seconds),
    }


class APIHandler(web.RequestHandler):
    """JSON in, JSON out, hub-token authentication in ``prepare``."""

    identity: dict[str, Any]

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
        token = self._token()
        if token is None:
            raise web.HTTPError(401, "missing token: send 'Authorization: token <JupyterHub API token>'")
        spawner_token = self.context.spawner_token
        if spawner_token and hmac.compare_digest(token.encode(), spawner_token.encode()):
            self.identity = {"kind": "spawner", "name": "hub", "scopes": [], "groups": []}
            return
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

    def json_body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        return body

    def int_arg(self, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise web.HTTPError(400, f"{name} must be a whole number, got {raw!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise web.HTTPError(400, f"{name} must be between {minimum} and {maximum}, got {value}")
        return value

    async def groups_of(self, name: str) -> list[str]:
        if self.identity.get("kind") == "user" and self.identity.get("name") == name and "groups" in self.identity:
            return list(self.identity["groups"])
        if self.context.groups is None:
            return []
        return await self.context.groups(name)

    async def known_user(self, name: str) -> bool:
        try:
            self.manager.ledger.account(name)
            return True
        except UnknownAccount:
            pass
        if self.context.hub is None:
            return False
        try:
            return await self.context.hub.user(name) is not None
        except HubError as e:
            raise web.HTTPError(503, f"cannot reach JupyterHub to look up {name!r}: {e}") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif status_code >= 500:
            message = "internal error in the gpupool service; see its log"
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def on_finish(self) -> None:
        metrics = self.context.metrics
        if metrics is not None and hasattr(self, "_started"):
            metrics.api_latency.labels(type(self).__name__, self.request.method, str(self.get_status())).observe(
                time.perf_counter() - self._started
            )


class RootHandler(APIHandler):
    async def prepare(self) -> None:  # public: tells clients what this is
        self._started = time.perf_counter()

    def get(self) -> None:
        from .. import __version__

        self.write_json({"service": "gpupool", "version": __version__, "openapi": "openapi.json"})


class OpenAPIHandler(RootHandler):
    def get(self) -> None:
        self.finish(resources.files("gpupool_hub.service").joinpath("openapi.json").read_text())


class MeHandler(APIHandler):
    async def get(self) -> None:
        user = self.require_user()
        self.write_json(self.manager.views.me(user, await self.groups_of(user)))


class HistoryHandler(APIHandler):
    async def get(self, name: str | None = None) -> None:
        if name is None:
            user = self.require_user()
        else:
            self.require_admin()
            user = url_unescape(name)
            if not await self.known_user(user):
                raise web.HTTPError(404, f"no such user {user!r}")
        limit = self.int_arg("limit", 50, minimum=1, maximum=MAX_PAGE)
        before = self.int_arg("before", None, minimum=1)
        rows = self.manager.ledger.history(user, limit=limit, before=before)  # type: ignore[arg-type]
        nxt = rows[-1].id if len(rows) == limit else None
        self.write_json({"user": user, "entries": [entry_json(e) for e in rows], "next_before": nxt})


class UsersHandler(APIHandler):
    def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        after = self.get_argument("after", None)
        rows = self.manager.ledger.accounts(limit=limit, after=after)  # type: ignore[arg-type]
        self.write_json({
            "users": [{"name": a.name, "balance": format_tokens(a.balance)} for a in rows],
            "next_after": rows[-1].name if len(rows) == limit else None,
        })


class UserHandler(APIHandler):
    async def get(self, name: str) -> None:
        self.require_spawner_or_admin()  # the spawner shows the balance on the options form
        user = url_unescape(name)
        if not await self.known_user(user):
            raise web.HTTPError(404, f"no such user {user!r}")
        self.write_json(self.manager.views.me(user, await self.groups_of(user)))


class GrantHandler(APIHandler):
    async def post(self, name: str) -> None:
        self.require_admin()
        user = url_unescape(name)
        body = self.json_body()
        unknown = sorted(set(body) - {"amount", "reason"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {unknown}; a grant takes 'amount' and 'reason'")
        if "amount" not in body:
            raise web.HTTPError(400, "a grant needs an 'amount'")
        if isinstance(body["amount"], float):
            raise web.HTTPError(400, "send 'amount' as a string or integer (e.g. \"12.5\") so it stays exact")
        try:
            amount = parse_amount(body["amount"], what="amount")
        except AmountError as e:
            raise web.HTTPError(400, str(e)) from None
        limit = self.context.max_grant
        if amount == 0 or abs(amount) > limit:
            raise web.HTTPError(400, f"amount must be non-zero and at most {limit} tokens either way, got {amount}")
        if (amount * 1000) % 1:
            raise web.HTTPError(400, f"amount {amount} has more than three decimal places")
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 1000:
            raise web.HTTPError(400, "a grant needs a 'reason' (a non-empty string of at most 1000 characters)")
        key = self.request.headers.get("Idempotency-Key")
        if key is not None and not (0 < len(key) <= 200):
            raise web.HTTPError(400, "Idempotency-Key must be 1-200 characters")
        if not await self.known_user(user):
            raise web.HTTPError(404, f"no such user {user!r}")
        self.manager.accounts.ensure(user, await self.groups_of(user))
        try:
            entry, created = self.manager.accounts.grant(user, amount, reason.strip(), self.identity["name"], key)
        except IdempotencyConflict:
            raise web.HTTPError(409, f"Idempotency-Key {key!r} was already used for a different grant") from None
        self.write_json({"entry": entry_json(entry), "created": created,
                         "balance": format_tokens(self.manager.ledger.balance(user))}, 201 if created else 200)


class PoolHandler(APIHandler):
    def get(self) -> None:
        self.require_admin()
        active = {r.id: r for r in self.manager.ledger.active_allocations()}
        nodes = self.manager.pool.snapshot()
        for node in nodes:
            for gpu in node["gpus"]:
                gpu["allocated_fraction"] = format_tokens(Decimal(gpu.pop("allocated_milli")) / 1000)
                gpu["holders"] = [
                    {"allocation": a, "fraction": format_tokens(Decimal(m) / 1000),
                     "user": active[a].user if a in active else None,
                     "server": active[a].server if a in active else None}
                    for a, m in gpu["holders"].items()
                ]
        self.write_json({"nodes": nodes, "free": self.manager.pool.free_summary().as_dict(),
                         "unallocated_servers": self.context.reconcile_report(),
                         "teams": self.manager.reclaims.team_report()["teams"]})


class ModelsHandler(APIHandler):
    """The GPU models of the pool with their prices and what is free: what the
    spawn form shows. Any caller of the service may read it (prices are public
    within the hub); the pool itself, not ``c.GPUPool.nodes``, is the source."""

    def get(self) -> None:
        self.write_json(self.manager.inventory.catalog(self.manager.settings.min_start_hours))


class TeamsHandler(APIHandler):
    """Fair share: per team quota, usage, borrowed GPUs; reclaims in progress (admins)."""

    def get(self) -> None:
        self.require_admin()
        self.write_json(self.manager.reclaims.team_report())


class VerifyHandler(APIHandler):
    def get(self) -> None:
        self.require_admin()
        report = self.manager.ledger.verify()
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
        for i, e in enumerate(self.manager.ledger.iter_entries()):
            writer.writerow([e.id, e.account, e.kind, format_tokens(e.amount), _iso(e.created_at),
                             _iso(e.interval_start), _iso(e.interval_end), e.model or "", e.gpu_seconds or "",
                             e.reason, e.actor, e.key])
            if i % 1000 == 999:
                self.write(buf.getvalue())
                buf.seek(0)
                buf.truncate()
                await self.flush()
        self.write(buf.getvalue())
        self.finish()


class AllocationsHandler(APIHandler):
    def get(self) -> None:
        self.require_spawner_or_admin()
        views = self.manager.views
        self.write_json({"allocations": [views.allocation_json(r) for r in self.manager.ledger.active_allocations()]})

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
            record = self.manager.admission.admit(user, groups, server, req, models, key=key)
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
    def get(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        record = self.manager.ledger.allocation(alloc_id)
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})

    def delete(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        reason = self.get_argument("reason", "server stopped")[:200]
        at = self.get_argument("at", None)  # when the server stopped, for a release that comes late
        try:
            stopped = parse_instant(at) if at is not None else None
        except ValueError as e:
            raise web.HTTPError(400, f"'at' must be an ISO 8601 instant: {e}") from None
        record = self.manager.admission.release(alloc_id, reason, at=stopped)
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})


class AllocationByKeyHandler(APIHandler):
    """``DELETE /allocations/by-key/{key}``: the spawner gave up on a spawn attempt."""

    def delete(self, key: str) -> None:
        self.require_spawner_or_admin()
        key = url_unescape(key)
        if not 0 < len(key) <= KEY_MAX_LENGTH:
            raise web.HTTPError(400, f"a spawn attempt's key has 1-{KEY_MAX_LENGTH} characters")
        reason = self.get_argument("reason", "spawn abandoned")[:200]
        record = self.manager.admission.release_key(key, reason)
        views = self.manager.views
        self.write_json({"allocation": views.allocation_json(record) if record is not None else None})


class AuditHandler(APIHandler):
    """Every cull action with its reason (admins)."""

    def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        before = self.int_arg("before", None, minimum=1)
        user = self.get_argument("user", None)
        events = self.manager.ledger.audit_log(limit=limit, before=before, user=user)  # type: ignore[arg-type]
        self.write_json({
            "events": [{"id": e.id, "at": _iso(e.at), "user": e.user, "server": e.server, "action": e.action,
                        "reason": e.reason, "dry_run": e.dry_run, "detail": e.detail} for e in events],
            "next_before": events[-1].id if len(events) == limit else None,
        })


class MetricsHandler(APIHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        scopes = set(self.identity.get("scopes", []))
        if not (self.is_admin or self.is_spawner or "read:metrics" in scopes):
            raise web.HTTPError(403, "metrics need the admin scope or read:metrics")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.context.metrics.registry))  # type: ignore[union-attr]


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
        (rf"{api}/ledger/verify", VerifyHandler),
        (rf"{api}/ledger/export", ExportHandler),
        (rf"{api}/audit", AuditHandler),
        (rf"{api}/allocations", AllocationsHandler),
        (rf"{api}/allocations/by-key/{name}", AllocationByKeyHandler),
        (rf"{api}/allocations/{name}", AllocationHandler),
        (rf"{prefix.rstrip('/')}/metrics", MetricsHandler),
    ]
