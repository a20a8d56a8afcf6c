"""Admin pages (``{prefix}admin/…``): accounts, grants, teams, idle hours, audit, ledger check
(the pool map has a module of its own, ``poolmap.py``).

Every handler here sets ``admin_only``: ``PageHandler.check_hub_user`` lets
through only OAuth tokens that carry the admin scope. They read and write
through the same service units as the API (``pool.snapshot``,
``accounts.grant``, ``reclaims.team_report``, ``ledger.audit.page``,
``ledger.verify``), so a page can never disagree with the API.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from tornado import web

from ...ledger import SORTS, IdempotencyConflict
from ...identity.names import name_problem
from ...money.units import AmountError, format_tokens, from_milli, parse_amount
from ..api.base import database_trouble
from ..api.httpargs import INT64_MAX
from ..core.accounts import grant_text
from .base import PageHandler

ACCOUNTS_PAGE = 50
AUDIT_PAGE = 100
#: account names the grant form's user field suggests (the first by name)
NAMES_SUGGESTED = 500


class AdminPage(PageHandler):
    admin_only = True


class AdminIndexHandler(AdminPage):
    def get(self) -> None:
        self.redirect(self.url("admin/pool"))


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
    if (problem := name_problem(user)) is not None:  # the API's rule for names (gpupool_hub/identity/names.py)
        raise GrantError(f"The user name {problem}.")
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

    async def get(self) -> None:
        await self.show(form={"user": self.get_argument("user", "")[:255], "amount": "", "reason": ""})

    async def show(self, *, form: dict[str, str], error: str | None = None, result: dict[str, Any] | None = None,
                   status: int = 200) -> None:
        # the user field suggests known account names (a <datalist>: no script); a form with
        # no suggestions still works while the database is away (submitting it answers 503)
        try:
            rows, _ = await self.manager.records.search_accounts.off_loop(limit=NAMES_SUGGESTED)
        except Exception as e:
            if database_trouble(e) is None:
                raise
            rows = []
        self.set_status(status)
        self.render_page("admin/grant.html", form=form, error=error, result=result, key=uuid.uuid4().hex,
                         max_grant=self.context.max_grant, names=[r.name for r in rows])

    async def post(self) -> None:
        form = {k: self.get_body_argument(k, "") for k in ("user", "amount", "reason", "key")}
        try:
            user, amount, reason, key = parse_grant(form, self.context.max_grant)
            if not await self.known_user(user):
                raise GrantError(f"No user {user!r} in the ledger or the hub.")
        except GrantError as e:
            return await self.show(form=form, error=str(e), status=400)
        groups = await self.groups_of(user)
        m = self.manager

        await m.accounts.ensure.off_loop(user, groups)  # a first visit posts the initial grant
        try:
            entry, created = await m.accounts.grant.off_loop(user, amount, reason, self.user["name"], f"page:{key}")
        except IdempotencyConflict:
            return await self.show(form=form, status=409,
                             error="This form was already used for a different grant; nothing was changed.")
        balance = await m.records.balance.off_loop(user)
        result = {"entry": entry, "created": created, "user": user, "balance": format_tokens(balance),
                  "text": grant_text(entry.amount, user)}
        await self.show(form={"user": "", "amount": "", "reason": ""}, result=result, status=201 if created else 200)


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
