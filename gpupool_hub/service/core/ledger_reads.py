"""The ledger's reads that the event loop asks for, each on a reader thread.

Handlers, pages and jobs read the database through this unit, so that every
read they make is a method a reader can follow into the ``ledger`` package and
that says, at its definition, that it runs on a reader thread (``@reads``): no
read here takes the write lock. Code already off the loop calls the ledger directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import date, datetime
from decimal import Decimal
from itertools import islice
from typing import TypeVar

from ...ledger import Account, AccountRow, AllocationRecord, AuditEvent, Entry, GpuUse, Ledger, VerifyReport, Window
from .threads import CoreThreads, reads

T = TypeVar("T")


class Records:
    """Reads of accounts, entries, allocations and the audit log, for the event loop."""

    def __init__(self, ledger: Ledger, *, threads: CoreThreads | None = None) -> None:
        self.ledger = ledger
        self.threads = threads

    @reads
    def checkpoint(self) -> int:
        """The ledger's background checkpoint (``Db.checkpoint``): on a reader thread, so
        it never waits behind, nor holds up, a write."""
        return self.ledger.db.checkpoint()

    @reads
    def balance(self, name: str) -> Decimal:
        return self.ledger.balance(name)

    @reads
    def balances(self, names: Iterable[str]) -> dict[str, Decimal]:
        """Balances of those of ``names`` with an account, in one read (see ``Ledger.balances``)."""
        return self.ledger.balances(names)

    @reads
    def account(self, name: str) -> Account:
        """The account, or :class:`~gpupool_hub.ledger.UnknownAccount`."""
        return self.ledger.account(name)

    @reads
    def accounts(self, *, limit: int = 100, after: str | None = None) -> list[Account]:
        return self.ledger.accounts(limit=limit, after=after)

    @reads
    def history(self, name: str, *, limit: int = 50, before: int | None = None) -> list[Entry]:
        return self.ledger.history(name, limit=limit, before=before)

    @reads
    def usage(self, name: str, starts: Sequence[datetime], *, limit: int,
              before: int | None = None) -> tuple[Window, list[Entry]]:
        """The usage page's reads: per-day totals from ``starts`` on, and a page of history."""
        return self.ledger.reports.daily_totals(name, starts), self.ledger.history(name, limit=limit, before=before)

    @reads
    def gpu_use(self, name: str, first: date, last: date) -> dict[date, GpuUse]:
        """What the user's GPUs did per local day (the ``gpu-use`` job's record)."""
        return self.ledger.reports.gpu_use_of(name, first, last)

    @reads
    def idle_gpu_time(self, by: str, since: date) -> list[tuple[str, int, int]]:
        """Idle and held GPU time (milli-seconds) per user or team since ``since``, largest idle first."""
        return self.ledger.reports.idle_gpu_time(by, since)

    @reads
    def search_accounts(self, *, query: str = "", negative: bool = False, sort: str = "name",
                        limit: int = 50, offset: int = 0) -> tuple[list[AccountRow], int]:
        return self.ledger.reports.search_accounts(query=query, negative=negative, sort=sort, limit=limit,
                                                   offset=offset)

    @reads
    def allocation(self, alloc_id: str) -> AllocationRecord | None:
        return self.ledger.allocations.get(alloc_id)

    @reads
    def active_allocations(self, user: str | None = None) -> list[AllocationRecord]:
        return self.ledger.allocations.active(user)

    @reads
    def active_allocations_on(self, *, nodes: Iterable[str] | None = None,
                              newest: int | None = None) -> list[AllocationRecord]:
        return self.ledger.allocations.active_on(nodes=nodes, newest=newest)

    @reads
    def unsettled_allocations(self) -> list[AllocationRecord]:
        """Held allocations whose batch job is pending, or whose stop is not yet confirmed."""
        return self.ledger.allocations.unsettled()

    @reads
    def active_holders(self) -> dict[str, tuple[str, str, bool]]:
        return self.ledger.allocations.active_holders()

    @reads
    def audit_log(self, *, limit: int = 100, before: int | None = None,
                  user: str | None = None) -> list[AuditEvent]:
        return self.ledger.audit.page(limit=limit, before=before, user=user)

    @reads
    def verify(self) -> VerifyReport:
        """Every balance recomputed from its entries (a long read: never on the loop)."""
        return self.ledger.verify()

    @reads
    def take(self, rows: Iterator[T], count: int) -> list[T]:
        """The next ``count`` rows of a ledger iterator (``iter_entries``, ``history_pages``),
        read page by page so a long export never holds the loop."""
        return list(islice(rows, count))
