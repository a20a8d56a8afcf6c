"""Admin pages (``{prefix}admin/…``): pool map, accounts, grants, teams, audit, ledger check.

Every handler here sets ``admin_only``: ``PageHandler.check_hub_user`` lets
through only OAuth tokens that carry the admin scope. They read and write
through the same service units as the API (``pool.snapshot``,
``accounts.grant``, ``reclaims.team_report``, ``ledger.audit_log``,
``ledger.verify``), so a page can never disagree with the API.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

from tornado import web

from ...ledger import SORTS, IdempotencyConflict
from ...units import AmountError, format_tokens, from_milli, parse_amount
from ..api.httpargs import INT64_MAX
from .base import PageHandler
from .charts import RESERVED, gpu_cell, holder_colours

ACCOUNTS_PAGE = 50
AUDIT_PAGE = 100


class AdminPage(PageHandler):
    admin_only = True


class AdminIndexHandler(AdminPage):
    def get(self) -> None:
        self.redirect(self.url("admin/pool"))


class PoolMapHandler(AdminPage):
    """Every node, every GPU a cell coloured by its holders (shares as parts of the cell)."""

    title = "Pool map"

    async def get(self) -> None:
        m = self.manager
        active = {r.id: r for r in await m.records.active_allocations.off_loop()}
        # reservations of a reclaim in progress are not allocations: their cells say "reserved"
        who = {a: (r.user, r.server, r.borrowed) for a, r in active.items()}
        snapshot = await m.views.pool_snapshot.off_loop()
        colours = holder_colours(who.get(a, (RESERVED,))[0]
                                 for n in snapshot for g in n["gpus"] for a in g["holders"])
        nodes = []
        holders: dict[str, float] = {}
        own = m.idle.own_utilization()  # each server's own figure, as of the idle job's last run
        for node in snapshot:
            report = m.inventory.reports.get(node["node"])
            cells = [gpu_cell(g, who, colours) for g in node["gpus"]]
            for cell in cells:
                cell.parts = [replace(p, utilization=own.get(p.allocation)) for p in cell.parts]
                cell.cannot_attribute = report.unattributed.get(cell.uuid) if report is not None else None
            for cell in cells:
                for part in cell.parts:
                    holders[part.user] = holders.get(part.user, 0.0) + float(part.fraction)
            nodes.append({"name": node["node"], "labels": node["labels"], "cells": cells,
                          "cpu": (node["cpu_milli"] - node["cpu_free"], node["cpu_milli"]),
                          "memory": (node["memory_mib"] - node["memory_free"], node["memory_mib"]),
                          "report": report, "unavailable": m.inventory.unavailable.get(node["node"]),
                          "problem": m.inventory.problems.get(node["node"])})
        legend = [(u, colours[u], f"{n:g}") for u, n in sorted(holders.items())]
        free = m.pool.free_summary().per_model
        accuracy = await m.queue.accuracy.off_loop()  # the wait estimates' record: a read-only query
        self.render_page("admin/pool.html", nodes=nodes, legend=legend, free=free, eta_accuracy=accuracy,
                         outside=self.context.reconcile_report(),
                         reclaims=m.reclaims.team_report()["reclaims"], allocations=list(active.values()))


class AccountsHandler(AdminPage):
    """Accounts with search, sort and a filter for negative balances."""

    title = "Accounts"

    async def get(self) -> None:
        query = self.get_argument("q", "").strip()[:255]
        sort = self.get_argument("sort", "name")
        if sort not in SORTS:
            raise web.HTTPError(400, f"sort must be one of {sorted(SORTS)}")
        negative = self.get_argument("negative", "") == "1"
        page = self.int_arg("page", 1, minimum=1, maximum=INT64_MAX // ACCOUNTS_PAGE)
        rows, total = await self.manager.records.search_accounts.off_loop(
            query=query, negative=negative, sort=sort,
            limit=ACCOUNTS_PAGE, offset=(page - 1) * ACCOUNTS_PAGE)
        self.render_page("admin/accounts.html", rows=rows, total=total, q=query, sort=sort, negative=negative,
                         page=page, pages=max(1, -(-total // ACCOUNTS_PAGE)), from_milli=from_milli)


class GrantError(ValueError):
    """What is wrong with a grant form, in words for the admin."""


def parse_grant(form: dict[str, str], max_grant: int) -> tuple[str, Decimal, str, str]:
    """(user, amount, reason, key) from the form, with the API's rules for amounts and reasons."""
    user = form.get("user", "").strip()
    if not user or len(user) > 255:
        raise GrantError("Name the user (their JupyterHub name).")
    try:
        amount = parse_amount(form.get("amount", "").strip(), what="amount")
    except AmountError as e:
        raise GrantError(str(e)) from None
    if amount == 0 or abs(amount) > max_grant:
        raise GrantError(f"The amount must be non-zero and at most {max_grant} tokens either way.")
    if (amount * 1000) % 1:
        raise GrantError(f"{amount} has more than three decimal places.")
    reason = form.get("reason", "").strip()
    if not reason or len(reason) > 1000:
        raise GrantError("A grant needs a reason (at most 1000 characters): it is shown in the user's history.")
    key = form.get("key", "")
    if not (0 < len(key) <= 100):
        raise GrantError("The form has no idempotency key; reload it.")
    return user, amount, reason, key


class GrantHandler(AdminPage):
    """The grant form. Each render carries a fresh idempotency key, so submitting the
    same form twice (a double click, a reload) grants once."""

    title = "Grant tokens"

    def get(self) -> None:
        self.show(form={"user": self.get_argument("user", "")[:255], "amount": "", "reason": ""})

    def show(self, *, form: dict[str, str], error: str | None = None, result: dict[str, Any] | None = None,
             status: int = 200) -> None:
        self.set_status(status)
        self.render_page("admin/grant.html", form=form, error=error, result=result, key=uuid.uuid4().hex,
                         max_grant=self.context.max_grant)

    async def post(self) -> None:
        form = {k: self.get_body_argument(k, "") for k in ("user", "amount", "reason", "key")}
        try:
            user, amount, reason, key = parse_grant(form, self.context.max_grant)
            if not await self.known_user(user):
                raise GrantError(f"No user {user!r} in the ledger or the hub.")
        except GrantError as e:
            return self.show(form=form, error=str(e), status=400)
        groups = await self.groups_of(user)
        m = self.manager

        await m.accounts.ensure.off_loop(user, groups)  # a first visit posts the initial grant
        try:
            entry, created = await m.accounts.grant.off_loop(user, amount, reason, self.user["name"], f"page:{key}")
        except IdempotencyConflict:
            return self.show(form=form, status=409,
                             error="This form was already used for a different grant; nothing was changed.")
        balance = await m.records.balance.off_loop(user)
        result = {"entry": entry, "created": created, "user": user, "balance": format_tokens(balance)}
        self.show(form={"user": "", "amount": "", "reason": ""}, result=result, status=201 if created else 200)


class TeamsHandler(AdminPage):
    title = "Teams"

    async def get(self) -> None:
        self.render_page("admin/teams.html", report=await self.manager.reclaims.team_report.off_loop())


IDLE_RANGES = (7, 30)


async def idle_tables(manager: Any) -> list[dict[str, Any]]:
    """Idle GPU-hours by user and by team over each of ``IDLE_RANGES`` (local days up to
    today), largest first: the GPU time held while its own processes did nothing."""
    today = manager.clock().astimezone(manager.settings.tz).date()
    out = []
    for days in IDLE_RANGES:
        since = today - timedelta(days=days - 1)
        for by in ("user", "team"):
            rows = [{"name": name, "idle_hours": _hours(idle), "held_hours": _hours(held),
                     "idle_percent": round(100 * idle / held) if held else 0}
                    for name, idle, held in await manager.records.idle_gpu_time.off_loop(by, since)]
            out.append({"days": days, "by": by, "rows": rows})
    return out


def _hours(milli_seconds: int) -> Decimal:
    return (Decimal(milli_seconds) / 3_600_000).quantize(Decimal("0.01"))


class IdleHoursHandler(AdminPage):
    """Idle GPU-hours by user and by team over 7 and 30 days (``gpu-use`` job's record)."""

    title = "Idle GPU-hours"

    async def get(self) -> None:
        tables = await idle_tables(self.manager)
        self.render_page("admin/idle.html", tables=tables, teams=self.manager.settings.team_table().enabled)


class AuditHandler(AdminPage):
    title = "Audit log"

    async def get(self) -> None:
        user = self.get_argument("user", "").strip() or None
        before = self.int_arg("before", None, minimum=1)
        events = await self.manager.records.audit_log.off_loop(limit=AUDIT_PAGE, before=before, user=user)
        self.render_page("admin/audit.html", events=events, user=user or "",
                         next_before=events[-1].id if len(events) == AUDIT_PAGE else None)


class LedgerHandler(AdminPage):
    """"Verify the ledger": recompute every balance from its entries (a POST, so a
    crawler or a prefetch never runs it)."""

    title = "Ledger"

    def get(self) -> None:
        self.render_page("admin/ledger.html", report=None)

    async def post(self) -> None:
        self.render_page("admin/ledger.html", report=await self.manager.records.verify.off_loop())
