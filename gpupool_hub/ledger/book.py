"""The book: accounts, their entries and balances, and the stores of everything else the
service records, all on one :class:`~gpupool_hub.ledger.database.Db`.

Append-only entries, each with a unique idempotency key, and a per-account balance kept in
the same transaction as the entries (so reading a balance is one indexed row). A balance is
never edited on its own; :meth:`Ledger.verify` recomputes every balance from the entries
and reports any mismatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime, timezone
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ..money.credits import DueCredit, capped
from ..money.units import from_milli
from .allocations import Allocations
from .audit import Audit, insert_event
from .carries import Carries
from .database import DEFAULT_BUSY_TIMEOUT, Db, aware, chunks, db_time, insert_new, utcnow
from .gpu_use import GpuUseDays
from .intervals import Intervals
from .leases import Leases
from .migrations import open_schema
from .node_devices import Nodes
from .postings import ensure_accounts, entry_of, write_postings
from .queue import Queue
from .records import Account, AuditEvent, Credited, Entry, Mismatch, Posted, Posting, UnknownAccount, VerifyReport
from .reports import Reports
from .schema import accounts, entries, intervals, meta_table

# Built once with a bound parameter: every spawn reads its user's account.
_ACCOUNT = sa.select(accounts).where(accounts.c.name == sa.bindparam("name"))


def _account(row: sa.Row) -> Account:  # type: ignore[type-arg]
    m = row._mapping
    return Account(
        name=m["name"],
        balance=from_milli(m["balance_milli"]),
        created_at=aware(m["created_at"]),  # type: ignore[arg-type]
        credits_through=m["credits_through"],
    )


class Ledger:
    """Append-only token ledger over any SQLAlchemy URL (SQLite or PostgreSQL), and the
    stores of the service's other records on the same database, reached as attributes:
    ``allocations``, ``queue``, ``audit``, ``nodes``, ``intervals``, ``gpu_use``,
    ``carries``, ``leases`` and the pages' ``reports``."""

    def __init__(self, url: str = "sqlite:///gpupool.sqlite", *, engine: Engine | None = None,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT, background_checkpoints: bool = False,
                 upgrade: bool = False) -> None:
        """``background_checkpoints``: the caller runs ``db.checkpoint()`` every few seconds, so
        writes need not (see ``engine.py``); for a long-lived process only. Opening never changes an
        existing schema: an older one raises ``SchemaOutdated`` unless ``upgrade`` (then an SQLite file
        is backed up first); an empty database is created at head (``migrations.open_schema``)."""
        self.db = Db(url, engine=engine, busy_timeout=busy_timeout, background_checkpoints=background_checkpoints)
        self._epoch: datetime | None = None
        open_schema(self.db.engine, url if engine is None else None, upgrade=upgrade)
        self.allocations = Allocations(self.db)
        self.queue = Queue(self.db)
        self.audit = Audit(self.db)
        self.nodes = Nodes(self.db)
        self.intervals = Intervals(self.db)
        self.gpu_use = GpuUseDays(self.db)
        self.carries = Carries(self.db)
        self.leases = Leases(self.db)
        self.reports = Reports(self.db)

    def close(self) -> None:
        self.db.close()

    # ---- writes

    def post(self, posting: Posting, *, now: datetime | None = None) -> Posted:
        """Record one entry (or return the first one recorded under its key)."""
        return self.post_many([posting], now=now)[0]

    def post_many(
        self,
        postings: Sequence[Posting],
        *,
        now: datetime | None = None,
        complete_interval: tuple[str, datetime, datetime] | None = None,
        carry: Mapping[tuple[str, str], Decimal] | None = None,
        audit_event: AuditEvent | None = None,
    ) -> list[Posted]:
        """Record entries in one transaction: all of them or none.

        Replayed keys are not recorded again; a key reused for a different
        entry raises ``IdempotencyConflict`` and nothing of the batch is kept.
        ``complete_interval=(job, start, end)`` marks that job interval done in
        the same transaction; ``carry`` stores debit remainders (see ``carries``)
        in it too; ``audit_event`` is recorded in it when an entry was (a replay
        records none), with the first entry's id in its ``detail``.
        """
        now = now or utcnow()
        with self.db.write() as conn:
            results = write_postings(conn, postings, now)
            if complete_interval is not None:
                job, start, end = complete_interval
                conn.execute(
                    insert_new(conn, intervals),
                    dict(job=job, start=db_time(start), end=db_time(end), completed_at=db_time(now),
                         entries=sum(r.created for r in results)),
                )
            if carry:
                self.carries.store(conn, carry)
            if audit_event is not None and any(r.created for r in results):
                insert_event(conn, AuditEvent(**{**audit_event.__dict__,
                                                 "detail": {**(audit_event.detail or {}), "entry": results[0].entry.id}}))
        return results

    def open_account(self, name: str, now: datetime | None = None) -> None:
        """Create an empty account if it does not exist (its grant comes from ``post_credits``)."""
        with self.db.write() as conn:
            ensure_accounts(conn, [name], now or utcnow())

    def post_credits(
        self,
        name: str,
        due: Sequence[DueCredit],
        *,
        through: date,
        max_balance: Decimal | None = None,
        now: datetime | None = None,
    ) -> Credited:
        """Post scheduled credits, capped at ``max_balance``, and record that they
        were applied ``through`` a day — one transaction, so a crash repeats nothing.
        Answers the postings and the balance they left.

        A new user's first spawn comes here before anything else, so an account this opens
        is opened already marked ``through`` with a known balance of 0: three statements
        fewer than for an account that exists (on PostgreSQL each is a round trip).
        """
        now = now or utcnow()
        with self.db.write() as conn:
            opened = conn.execute(insert_new(conn, accounts).returning(accounts.c.name), dict(
                name=name, balance_milli=0, created_at=db_time(now), credits_through=through)).first()
            if opened is not None:
                balance = Decimal(0)
            else:
                locked = sa.select(accounts.c.balance_milli).where(accounts.c.name == name)
                if conn.dialect.name == "postgresql":
                    locked = locked.with_for_update()
                balance = from_milli(conn.execute(locked).scalar_one())
            results: list[Posted] = []
            for credit in due:
                amount = capped(credit.amount, balance, max_balance)
                if amount <= 0:
                    continue  # at the cap: nothing to record, the day still counts as applied
                posted = write_postings(
                    conn,
                    [Posting(name, credit.kind, amount, credit.key, reason=credit.reason)],
                    now,
                    ensured=True,
                )[0]
                if posted.created:
                    balance += amount
                results.append(posted)
            if opened is None:
                conn.execute(
                    accounts.update()
                    .where(accounts.c.name == name)
                    .where(sa.or_(accounts.c.credits_through.is_(None), accounts.c.credits_through < through))
                    .values(credits_through=through)
                )
        return Credited(results, balance)

    # ---- reads

    def balance(self, name: str) -> Decimal:
        """The balance of one account; ``UnknownAccount`` if it has none."""
        with self.db.read() as conn:
            value = conn.execute(
                sa.select(accounts.c.balance_milli).where(accounts.c.name == name)
            ).scalar_one_or_none()
        if value is None:
            raise UnknownAccount(name)
        return from_milli(value)

    def balances(self, names: Iterable[str]) -> dict[str, Decimal]:
        """The balance of each of ``names`` that has an account (the others are left out), in
        one query per 500 names: the periodic jobs judge every holder, not one at a time."""
        wanted = sorted(set(names))
        out: dict[str, Decimal] = {}
        with self.db.read() as conn:
            for chunk in chunks(wanted):
                rows = conn.execute(sa.select(accounts.c.name, accounts.c.balance_milli)
                                    .where(accounts.c.name.in_(list(chunk))))
                out.update((name, from_milli(milli)) for name, milli in rows)
        return out

    def account(self, name: str) -> Account:
        with self.db.read() as conn:
            row = conn.execute(_ACCOUNT, {"name": name}).first()
        if row is None:
            raise UnknownAccount(name)
        return _account(row)

    def accounts(self, *, limit: int = 100, after: str | None = None) -> list[Account]:
        """Accounts by name, keyset-paginated (``after`` = last name of the previous page)."""
        q = sa.select(accounts).order_by(accounts.c.name).limit(limit)
        if after is not None:
            q = q.where(accounts.c.name > after)
        with self.db.read() as conn:
            return [_account(r) for r in conn.execute(q)]

    def credits_through_of(self, names: Iterable[str]) -> dict[str, date | None]:
        """``credits_through`` of each existing account among ``names`` (one query per 500)."""
        out: dict[str, date | None] = {}
        with self.db.read() as conn:
            for chunk in chunks(sorted(set(names))):
                q = sa.select(accounts.c.name, accounts.c.credits_through).where(accounts.c.name.in_(chunk))
                out.update({name: through for name, through in conn.execute(q)})
        return out

    def history(self, name: str, *, limit: int = 50, before: int | None = None) -> list[Entry]:
        """A user's entries, newest first; ``before`` = the last id of the previous page."""
        q = (
            sa.select(entries)
            .where(entries.c.account == name)
            .order_by(entries.c.id.desc())
            .limit(limit)
        )
        if before is not None:
            q = q.where(entries.c.id < before)
        with self.db.read() as conn:
            return [entry_of(r) for r in conn.execute(q)]

    def history_pages(self, name: str, *, batch: int = 1000) -> Iterator[list[Entry]]:
        """All of one user's entries, newest first (as :meth:`history`), a page at a time,
        so the CSV download streams instead of holding a long history in memory."""
        before: int | None = None
        while True:
            page = self.history(name, limit=batch, before=before)
            if page:
                yield page
            if len(page) < batch:
                return
            before = page[-1].id

    def iter_entries(self, *, batch: int = 1000) -> Iterator[Entry]:
        """Every entry in id order, in pages (for exports)."""
        last = 0
        while True:
            with self.db.read() as conn:
                rows = conn.execute(
                    sa.select(entries).where(entries.c.id > last).order_by(entries.c.id).limit(batch)
                ).all()
            if not rows:
                return
            for row in rows:
                yield entry_of(row)
            last = rows[-1]._mapping["id"]

    def epoch(self, now: datetime) -> datetime:
        """When this ledger started charging: the first debit interval begins here.

        Recorded once (the first caller's ``now``), so a restarted service
        neither charges the time before it was installed nor skips any after.
        """
        if self._epoch is None:
            with self.db.write() as conn:
                conn.execute(insert_new(conn, meta_table),
                             dict(key="epoch", value=now.astimezone(timezone.utc).isoformat()))
                value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "epoch")).scalar_one()
            self._epoch = datetime.fromisoformat(value)
        return self._epoch

    def verify(self) -> VerifyReport:
        """Recompute every balance from its entries; report accounts whose stored balance differs."""
        sums = (
            sa.select(entries.c.account, sa.func.sum(entries.c.amount_milli).label("total"),
                      sa.func.count().label("n"))
            .group_by(entries.c.account)
            .subquery()
        )
        q = sa.select(accounts.c.name, accounts.c.balance_milli, sums.c.total, sums.c.n).select_from(
            accounts.outerjoin(sums, sums.c.account == accounts.c.name)
        )
        mismatches = []
        n_accounts = n_entries = 0
        with self.db.read() as conn:
            for name, stored, total, n in conn.execute(q):
                n_accounts += 1
                n_entries += n or 0
                if int(stored) != int(total or 0):
                    mismatches.append(Mismatch(name, from_milli(stored), from_milli(int(total or 0))))
        return VerifyReport(n_accounts, n_entries, tuple(mismatches))

