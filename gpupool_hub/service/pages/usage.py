""""My GPU usage": a user's balance, charts, forecast, credits and history.

Every user sees their own page at ``{prefix}``; nothing in its URL names a
user, so there is nothing to change to see someone else's. Admins see any
user's page at ``{prefix}admin/users/{name}`` (the same view, admin-only).

The numbers come from the same places as the API's: the cached ``me`` view
(balance, floor, allocations, burn rate, time to floor, next credits) and the
ledger's entries (charts and history), read in one transaction per page.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from markupsafe import Markup
from tornado import web

from ...ledger import Entry, GpuUse, Window
from ...identity.names import name_problem
from ...timefmt import iso, time_html
from ...money.credits import SCHEDULED
from ...money.units import format_tokens, from_milli
from ..api.notices import NOTICE_ID
from ..core.manager import PoolManager
from .base import MINUS, PageHandler, tokens
from .charts import BarChart, DayPoint, LineChart, balance_chart, stacked_bars

RANGES = (30, 90)
PAGE = 50


@dataclass(frozen=True)
class Voice:
    """Whose page it is, in words: the user's own ("You paid", "your GPUs") or an admin's
    view of someone else's ("bob paid", "bob's GPUs")."""

    name: str | None = None  # None: the reader's own page

    @property
    def subject(self) -> str:
        return "You" if self.name is None else self.name

    @property
    def possessive(self) -> str:
        return "your" if self.name is None else f"{self.name}'s"

    def verb(self, you: str, they: str) -> str:
        """``you`` after "You", else ``they`` ("reach"/"reaches")."""
        return you if self.name is None else they


OWN = Voice()


@dataclass(frozen=True)
class UsageView:
    user: str
    voice: Voice
    me: dict[str, Any]
    days: int
    balance_chart: LineChart
    spend_chart: BarChart
    spend_total: Decimal
    forecast: str
    next_credits: list[tuple[str, datetime, str]]  # (what, when, amount)
    history: list[Entry]
    next_before: int | None
    before: int | None
    gpu_days: list[GpuDay]


@dataclass(frozen=True)
class GpuDay:
    """One day of "what your GPUs did": what was charged for GPU time used that day and how
    busy the user's GPUs or shares were while held (None: not measured)."""

    day: date
    charged: Decimal
    held_hours: Decimal
    busy_percent: int | None
    voice: Voice = OWN

    @property
    def sentence(self) -> str:
        v = self.voice
        paid = f"{v.subject} paid {format_tokens(self.charged)} tokens"
        if self.busy_percent is None:
            return f"{paid}; how busy {v.possessive} GPUs were is not known for that day."
        return f"{paid}; {v.possessive} GPUs were busy {self.busy_percent} % of that time."


def gpu_days(day_list: list[date], spend: dict[date, dict[str, Decimal]], use: dict[date, GpuUse],
             voice: Voice = OWN) -> list[GpuDay]:
    """Days with GPU time charged or held, newest first. Busy is over the measured time only
    (time whose use is unknown counts neither way)."""
    out = []
    for day in reversed(day_list):
        charged = sum(spend.get(day, {}).values(), Decimal(0))
        u = use.get(day)
        if not charged and u is None:
            continue
        measured = 0 if u is None else u.held_milli - u.unknown_milli
        busy = None if measured <= 0 else round(100 * u.busy_milli / measured)  # type: ignore[union-attr]
        held = Decimal(0) if u is None else (Decimal(u.held_milli) / 3_600_000).quantize(Decimal("0.01"))
        out.append(GpuDay(day, charged, held, busy, voice))
    return out


def local_days(now: datetime, tz: Any, days: int) -> list[date]:
    """The ``days`` local days up to today (the pool's time zone), oldest first."""
    today = now.astimezone(tz).date()
    return [today - timedelta(days=days - 1 - i) for i in range(days)]


def daily_series(window: Window, day_list: list[date]) -> tuple[list[DayPoint], dict[date, dict[str, Decimal]]]:
    """End-of-day balances with each day's credits and debits, and spend per day and
    GPU model, for the days of ``day_list`` (``window`` holds their totals)."""
    days = len(day_list)
    credits = [0] * days
    debits = [0] * days
    spend: dict[date, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in window.totals:
        credits[t.day] += t.credit_milli
        debits[t.day] += t.debit_milli
        if t.kind == "debit" and t.debit_milli:
            spend[day_list[t.used_day]][t.model or "unknown"] -= t.debit_milli
    balance = window.balance_milli - sum(credits) - sum(debits)  # the balance before the first day
    points = []
    for i, day in enumerate(day_list):
        balance += credits[i] + debits[i]
        points.append(DayPoint(day, from_milli(balance), from_milli(credits[i]), from_milli(debits[i])))
    spent = {d: {m: from_milli(v) for m, v in per.items()} for d, per in spend.items()}
    return points, spent


def since_opening(points: list[DayPoint], window: Window, tz: Any) -> list[DayPoint]:
    """The days from the account's opening on (or its first entry's day, if earlier): before
    it the user had no balance, not a balance of 0."""
    first = len(points) - 1 if points else 0
    if window.opened_at is not None:
        opened = window.opened_at.astimezone(tz).date()
        first = next((i for i, p in enumerate(points) if p.day >= opened), first)
    first = min([first, *(t.day for t in window.totals)])
    return points[max(0, first):]


def forecast_text(me: dict[str, Any], now: datetime, tz: Any, voice: Voice = OWN) -> str:
    """"At −3.5/h you reach the floor on Tue 14:00", from the ``me`` view."""
    burn = Decimal(me["burn_rate_per_hour"])
    floor = tokens(me["floor"])
    seconds = me.get("time_to_floor_seconds")
    who = voice.subject if voice.name is not None else "you"
    if burn <= 0 or seconds is None:
        return f"Nothing is charging now: {voice.possessive} balance only changes with credits and grants."
    rate = f"At {MINUS}{tokens(burn)}/h"
    if seconds <= 0:
        return f"{rate} {who} {voice.verb('are', 'is')} at the floor ({floor}): servers holding GPUs are stopped."
    reach = now + timedelta(seconds=seconds)
    fmt = "%a %H:%M" if reach - now < timedelta(days=6) else "%a %-d %b %H:%M"
    # the pages' one date wording, which the viewer's browser puts in its own zone
    return Markup("{} {} {} the floor ({}) on {}: {} GPU servers stop then.").format(
        rate, who, voice.verb("reach", "reaches"), floor, time_html(reach, tz, fmt), voice.possessive)


def next_credits(me: dict[str, Any]) -> list[tuple[str, datetime, str]]:
    out = []
    credits = me["credits"]
    for what, amount_key, at_key in ((k.title, k.name, k.next_at) for k in SCHEDULED):
        amount = Decimal(credits.get(amount_key) or 0)
        at = credits.get(at_key)
        if amount > 0 and at:
            out.append((what, datetime.fromisoformat(at.replace("Z", "+00:00")), format_tokens(amount)))
    return sorted(out, key=lambda c: c[1])


async def build_view(manager: PoolManager, user: str, me: dict[str, Any], days: int,
                     before: int | None, voice: Voice = OWN) -> UsageView:
    """The page's numbers (``me`` is the user's ``GET me`` view), read on a reader thread;
    ``voice``: whose page it is to the reader."""
    now = manager.clock()
    tz = manager.settings.tz
    day_list = local_days(now, tz, days)
    starts = [datetime.combine(d, time.min, tz) for d in day_list]
    window, history = await manager.records.usage.off_loop(user, starts, limit=PAGE, before=before)
    use = await manager.records.gpu_use.off_loop(user, day_list[0], day_list[-1])
    points, spend = daily_series(window, day_list)
    return UsageView(
        user=user, voice=voice, me=me, days=days,
        balance_chart=balance_chart(since_opening(points, window, tz), Decimal(me["floor"]), days=day_list),
        spend_chart=stacked_bars(day_list, spend),
        spend_total=sum((v for per in spend.values() for v in per.values()), Decimal(0)),
        forecast=forecast_text(me, now, tz, voice), next_credits=next_credits(me),
        history=history, next_before=history[-1].id if len(history) == PAGE else None, before=before,
        gpu_days=gpu_days(day_list, spend, use, voice),
    )


CSV_HEADER = ["id", "kind", "amount", "created_at", "interval_start", "interval_end", "model", "gpu_seconds",
              "reason", "actor"]


def csv_rows(entries: list[Entry]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    for e in entries:
        writer.writerow([e.id, e.kind, format_tokens(e.amount), iso(e.created_at), iso(e.interval_start),
                         iso(e.interval_end), e.model or "", "" if e.gpu_seconds is None else str(e.gpu_seconds),
                         e.reason, e.actor])
    return buf.getvalue()


class UsageBase(PageHandler):
    """Renders the usage view of ``self.subject()``; CSV download alongside."""

    title = "My GPU usage"

    def subject(self) -> str:
        raise NotImplementedError("Subclass must provide implementation")

    async def render_usage(self, user: str, base: str, csv_url: str, voice: Voice = OWN) -> None:
        days = self.int_arg("days", RANGES[0])
        if days not in RANGES:
            raise web.HTTPError(400, f"days must be one of {RANGES}, got {days}")
        before = self.int_arg("before", None, minimum=1)
        m = self.manager
        # as GET me: opens the account and posts credits due, on the writer only when it must
        me = await m.views.serve_me(user, await self.groups_of(user))
        view = await build_view(m, user, me, days, before, voice)
        self.render_page("usage.html", view=view, base=base, csv_url=csv_url, ranges=RANGES, now=m.clock())

    async def send_csv(self, user: str) -> None:
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f"attachment; filename*=UTF-8''{quote(f'gpupool-{user}.csv')}")
        self.write(",".join(CSV_HEADER) + "\r\n")
        pages = self.manager.ledger.history_pages(user)
        while page := await self.manager.records.take.off_loop(pages, 1):
            self.write(csv_rows(page[0]))
            await self.flush()
        self.finish()


class MyUsageHandler(UsageBase):
    """``{prefix}``: the logged-in user's own page. Query arguments never name a user."""

    users_only = True

    async def get(self) -> None:
        await self.render_usage(self.user["name"], self.url(), self.url("me/history.csv"))


class MyHistoryCSVHandler(UsageBase):
    """``{prefix}me/history.csv``: every entry of the logged-in user."""

    users_only = True

    async def get(self) -> None:
        user = self.user["name"]
        await self.manager.views.serve_me(user, await self.groups_of(user))  # opens the account, as GET me
        await self.send_csv(user)


class MyNoticeDismissHandler(PageHandler):
    """``POST {prefix}me/notices``: dismiss one of the logged-in user's notices (what the pool
    did to their servers) from "My GPU usage". A user stopped at the floor cannot reach
    JupyterLab's widget, so the hub's own page must dismiss too (issue 39.6). The notice is
    named in the form; a notice of someone else's is refused as an unknown one (404: nothing
    learned, nothing changed). Origin and ``_xsrf`` are checked by ``PageHandler.prepare``."""

    users_only = True

    async def post(self) -> None:
        user = self.user["name"]
        notice = self.get_body_argument("notice", "").strip()
        if not NOTICE_ID.fullmatch(notice):
            raise web.HTTPError(400, f"No notice named {notice[:40]!r}; nothing was changed.")
        if not await self.manager.notices.dismiss.off_loop(user, int(notice)):
            raise web.HTTPError(404, f"You have no notice {notice}; nothing was changed.")
        self.redirect(self.url() + "#notices", status=303)  # back to the page, which no longer lists it


class AdminUserMixin(UsageBase):
    admin_only = True

    async def known(self, user: str) -> str:
        """``user`` from the URL (tornado has already unquoted it: no second unquoting)."""
        if (problem := name_problem(user)) is not None:  # the API's rule for names: no account opens
            raise web.HTTPError(400, f"The user name {problem}.")
        if not await self.known_user(user):
            raise web.HTTPError(404, f"No such user {user!r}.")
        return user


class UserUsageHandler(AdminUserMixin):
    """``{prefix}admin/users/{name}``: an admin's view of any user's page."""

    async def get(self, name: str) -> None:
        user = await self.known(name)
        self.title = f"GPU usage of {user}"
        base = self.url(f"admin/users/{quote(user, safe='')}")
        # an admin reads "bob's GPUs", not "your GPUs" (their own page at admin/users/ too)
        voice = OWN if user == self.user["name"] else Voice(user)
        await self.render_usage(user, base, base + "/history.csv", voice)


class UserHistoryCSVHandler(AdminUserMixin):
    async def get(self, name: str) -> None:
        user = await self.known(name)
        await self.manager.views.serve_me(user, await self.groups_of(user))  # opens the account, as GET me
        await self.send_csv(user)
