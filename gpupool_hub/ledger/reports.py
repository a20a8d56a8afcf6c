"""The pages' read models: a user's daily sums and balance, the admins' account search, GPU
time per day and idle GPU time. Reached as ``ledger.reports``; they only read, and the
pages reach the database through them (and the book's reads) alone.

The pages summarise up to 90 days of a user's entries into a handful of daily numbers.
Fetching 10,000 entries to add them up in Python costs most of the page's time budget
(turning timestamps into datetimes alone takes ~100 ms), so the database adds them up per
day and kind and returns a few hundred rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timezone
from functools import lru_cache

import sqlalchemy as sa

from .database import Db, aware
from .records import AccountRow, DayTotal, GpuUse, UnknownAccount, Window
from .schema import accounts, entries, gpu_use

#: the account search's orders, by the name a page asks for
SORTS = {
    "name": (accounts.c.name,),
    "-name": (accounts.c.name.desc(),),
    "balance": (accounts.c.balance_milli, accounts.c.name),
    "-balance": (accounts.c.balance_milli.desc(), accounts.c.name),
}


def _aware_page(value: datetime | None) -> datetime | None:
    """The ledger stores naive UTC; the pages compute in aware datetimes."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def _naive_utc(value: datetime) -> datetime:
    """The ledger stores naive UTC."""
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def _day_index(column: sa.ColumnElement, starts: Sequence[datetime], lo: int = 0, hi: int | None = None
               ) -> sa.ColumnElement | int:
    """Which day a timestamp falls on, as a binary search of nested ``CASE WHEN t < start …``.

    Days are the pool's local days, so their starts are computed in Python (time
    zones, DST) and compared in SQL the same way in SQLite and PostgreSQL. A
    binary search costs each row about 7 comparisons for 90 days instead of 45."""
    hi = len(starts) - 1 if hi is None else hi
    if lo == hi:
        return lo
    mid = (lo + hi + 1) // 2  # first day of the upper half
    return sa.case((column < _naive_utc(starts[mid]), _day_index(column, starts, lo, mid - 1)),
                   else_=_day_index(column, starts, mid, hi))


@lru_cache(maxsize=16)
def _totals_query(starts: tuple[datetime, ...]) -> sa.Select:
    """The grouped query for one set of day starts (they change once a day), built once."""
    day = sa.literal_column("0") if len(starts) == 1 else _day_index(entries.c.created_at, starts)
    used_col = sa.func.coalesce(entries.c.interval_start, entries.c.created_at)
    used = sa.literal_column("0") if len(starts) == 1 else _day_index(used_col, starts)
    day, used = day.label("day"), used.label("used")  # type: ignore[union-attr]
    amount = entries.c.amount_milli
    return (
        sa.select(day, used, entries.c.kind, entries.c.model,
                  sa.func.sum(sa.case((amount > 0, amount), else_=0)),
                  sa.func.sum(sa.case((amount < 0, amount), else_=0)))
        .where(entries.c.account == sa.bindparam("user"), entries.c.created_at >= _naive_utc(starts[0]))
        .group_by(day, used, entries.c.kind, entries.c.model)
    )


class Reports:
    """Read-only summaries for the web pages."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def daily_totals(self, user: str, starts: Sequence[datetime]) -> Window:
        """The balance and per-day sums of the entries posted since ``starts[0]``.

        ``starts`` are the instants each day begins. The database groups the rows
        (a few hundred come back, not 10,000 entries), and on SQLite the balance is
        read in the same snapshot, so the chart's line ends exactly at the balance
        (PostgreSQL's READ COMMITTED gives each statement its own snapshot anyway)."""
        q = _totals_query(tuple(starts))
        with self.db.read() as conn:  # one read transaction (never the writer's lock)
            account = conn.execute(
                sa.select(accounts.c.balance_milli, accounts.c.created_at).where(accounts.c.name == user)
            ).first()
            if account is None:
                raise UnknownAccount(user)
            totals = [DayTotal(int(r[0]), int(r[1]), r[2], r[3], int(r[4] or 0), int(r[5] or 0))
                      for r in conn.execute(q, {"user": user})]
        return Window(int(account.balance_milli), totals, aware(account.created_at))

    def search_accounts(self, *, query: str = "", negative: bool = False, sort: str = "name",
                        limit: int = 50, offset: int = 0) -> tuple[list[AccountRow], int]:
        """Accounts whose name contains ``query`` (case-insensitive), optionally only negative
        balances, sorted by name or balance; returns one page and the number that match."""
        where = []
        if query:
            escaped = query.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(sa.func.lower(accounts.c.name).like(f"%{escaped}%", escape="\\"))
        if negative:
            where.append(accounts.c.balance_milli < 0)
        q = sa.select(accounts.c.name, accounts.c.balance_milli, accounts.c.created_at).where(*where)
        q = q.order_by(*SORTS.get(sort, SORTS["name"])).limit(limit).offset(offset)
        count = sa.select(sa.func.count()).select_from(accounts).where(*where)
        with self.db.read() as conn:
            rows = [AccountRow(r[0], int(r[1]), _aware_page(r[2])) for r in conn.execute(q)]  # type: ignore[arg-type]
            total = int(conn.execute(count).scalar_one())
        return rows, total

    def gpu_use_of(self, user: str, first: date, last: date) -> dict[date, GpuUse]:
        """One user's GPU time per day from ``first`` to ``last`` (local days; all teams summed)."""
        q = (sa.select(gpu_use.c.day, sa.func.sum(gpu_use.c.held_milli), sa.func.sum(gpu_use.c.busy_milli),
                       sa.func.sum(gpu_use.c.unknown_milli))
             .where(gpu_use.c.user == user, gpu_use.c.day >= first, gpu_use.c.day <= last)
             .group_by(gpu_use.c.day))
        with self.db.read() as conn:
            return {r[0]: GpuUse(r[0], user, "", int(r[1]), int(r[2]), int(r[3])) for r in conn.execute(q)}

    def idle_gpu_time(self, by: str, since: date) -> list[tuple[str, int, int]]:
        """Idle GPU time since ``since`` (a local day) per user or per team (``by``): ``(name,
        idle, held)`` in thousandths of GPU-seconds, the most idle first (ties: by name)."""
        column = {"user": gpu_use.c.user, "team": gpu_use.c.team}[by]
        idle = sa.func.sum(gpu_use.c.held_milli - gpu_use.c.busy_milli - gpu_use.c.unknown_milli)
        q = (sa.select(column, idle, sa.func.sum(gpu_use.c.held_milli)).where(gpu_use.c.day >= since)
             .group_by(column).order_by(idle.desc(), column))
        with self.db.read() as conn:
            return [(r[0], int(r[1]), int(r[2])) for r in conn.execute(q)]
