"""Read-only ledger queries that only the pages need.

The pages summarise up to 90 days of a user's entries into a handful of daily
numbers. Building 10,000 ``Entry`` objects (with ``Decimal`` amounts) to add
them up again would cost most of the page's time budget, so these queries read
just the columns a chart needs, as plain integers (milli-tokens), in one
transaction with the balance they are anchored to. They only read the tables
``gpupool_hub.ledger`` defines and never write; they could move into
``Ledger`` unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa

from ...ledger import Entry, Ledger, UnknownAccount, accounts, entries


@dataclass(frozen=True)
class EntryRow:
    """One entry as the charts need it: when, how much (milli-tokens), what for."""

    created_at: datetime
    amount_milli: int
    kind: str
    model: str | None
    interval_start: datetime | None


@dataclass(frozen=True)
class Window:
    """A user's balance now and every entry since ``since``, read in one transaction."""

    balance_milli: int
    rows: list[EntryRow]


def _aware(value: datetime | None) -> datetime | None:
    """The ledger stores naive UTC; the pages compute in aware datetimes."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def _naive_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def entries_since(ledger: Ledger, user: str, since: datetime) -> Window:
    """The balance and the entries created at or after ``since`` (oldest first)."""
    q = (
        sa.select(entries.c.created_at, entries.c.amount_milli, entries.c.kind, entries.c.model,
                  entries.c.interval_start)
        .where(entries.c.account == user, entries.c.created_at >= _naive_utc(since))
        .order_by(entries.c.id)
    )
    with ledger.engine.begin() as conn:
        balance = conn.execute(
            sa.select(accounts.c.balance_milli).where(accounts.c.name == user)
        ).scalar_one_or_none()
        if balance is None:
            raise UnknownAccount(user)
        rows = [EntryRow(_aware(r[0]), int(r[1]), r[2], r[3], _aware(r[4]))  # type: ignore[arg-type]
                for r in conn.execute(q)]
    return Window(int(balance), rows)


def iter_user_entries(ledger: Ledger, user: str, *, batch: int = 1000) -> Iterator[list[Entry]]:
    """All of one user's entries, newest first (as the history table), a page at a time,
    so the CSV download streams instead of holding a long history in memory."""
    before: int | None = None
    while True:
        page = ledger.history(user, limit=batch, before=before)
        if page:
            yield page
        if len(page) < batch:
            return
        before = page[-1].id


@dataclass(frozen=True)
class AccountRow:
    name: str
    balance_milli: int
    created_at: datetime


SORTS = {
    "name": (accounts.c.name,),
    "-name": (accounts.c.name.desc(),),
    "balance": (accounts.c.balance_milli, accounts.c.name),
    "-balance": (accounts.c.balance_milli.desc(), accounts.c.name),
}


def search_accounts(ledger: Ledger, *, query: str = "", negative: bool = False, sort: str = "name",
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
    with ledger.engine.connect() as conn:
        rows = [AccountRow(r[0], int(r[1]), _aware(r[2])) for r in conn.execute(q)]  # type: ignore[arg-type]
        total = int(conn.execute(count).scalar_one())
    return rows, total
