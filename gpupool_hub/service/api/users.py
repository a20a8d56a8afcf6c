"""``me``, ``users``, ``users/{name}``: accounts, their history, and grants (admins)."""

from __future__ import annotations

from typing import Any

from tornado import web

from ...ledger import Entry, IdempotencyConflict
from ...timefmt import iso as _iso
from ...money.units import AmountError, format_tokens, parse_amount
from .base import MAX_PAGE, APIHandler
from .openapi import text_problem


def entry_json(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id, "kind": e.kind, "amount": format_tokens(e.amount), "reason": e.reason, "actor": e.actor,
        "created_at": _iso(e.created_at), "interval_start": _iso(e.interval_start),
        "interval_end": _iso(e.interval_end), "model": e.model,
        "gpu_seconds": None if e.gpu_seconds is None else str(e.gpu_seconds),
    }


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
        rows = await self.manager.records.history.off_loop(user, limit=limit, before=before)  # type: ignore[arg-type]
        nxt = rows[-1].id if len(rows) == limit else None
        self.write_json({"user": user, "entries": [entry_json(e) for e in rows], "next_before": nxt})


class UsersHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        after = self.name_arg("after")
        rows = await self.manager.records.accounts.off_loop(limit=limit, after=after)  # type: ignore[arg-type]
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
    openapi_path = "/users/{name}/grant"

    async def post(self, name: str) -> None:
        self.require_admin()
        user = self.path_name(name)
        body = self.json_body()
        try:
            amount = parse_amount(body["amount"], what="amount", places=3)
        except AmountError as e:
            raise web.HTTPError(400, str(e)) from None
        limit = self.context.max_grant
        if amount == 0 or abs(amount) > limit:
            raise web.HTTPError(400, f"amount must be non-zero and at most {limit} tokens either way, got {amount}")
        reason = body["reason"]
        if not reason.strip():
            raise web.HTTPError(400, "request body field /reason must not be blank")
        key = self.request.headers.get("Idempotency-Key")
        if key is not None and text_problem(key, max_length=200):
            raise web.HTTPError(400, f"Idempotency-Key {text_problem(key, max_length=200)}")
        if not await self.known_user(user):
            raise web.HTTPError(404, f"no such user {user!r}")
        await self.manager.accounts.ensure.off_loop(user, await self.groups_of(user))
        try:
            entry, created = await self.manager.accounts.grant.off_loop(user, amount, reason.strip(),
                                                                        self.identity["name"], key)
        except IdempotencyConflict:
            raise web.HTTPError(409, f"Idempotency-Key {key!r} was already used for a different grant") from None
        balance = await self.manager.records.balance.off_loop(user)
        self.write_json({"entry": entry_json(entry), "created": created,
                         "balance": format_tokens(balance)}, 201 if created else 200)


NAME = r"([^/]+)"

default_handlers = [
    (r"api/v1/me", MeHandler),
    (r"api/v1/me/history", HistoryHandler),
    (r"api/v1/users", UsersHandler),
    (rf"api/v1/users/{NAME}", UserHandler),
    (rf"api/v1/users/{NAME}/history", HistoryHandler),
    (rf"api/v1/users/{NAME}/grant", GrantHandler),
]
