"""The ledger: the only module that touches the database.

Append-only entries, each with a unique idempotency key, and a per-account
balance kept in the same transaction as the entries (so reading a balance is
one indexed row). A balance is never edited on its own; ``verify`` recomputes
every balance from the entries and reports any mismatch.

Amounts are integer milli-tokens in the database and ``Decimal`` outside it.
SQLite (the default) and PostgreSQL are both first-class; concurrent writers
from several processes are safe on both: SQLite transactions take the write
lock up front (``BEGIN IMMEDIATE``), PostgreSQL relies on the unique key and
row locks.

Reads never wait for writers: on SQLite they use connections of their own
(WAL mode, plain deferred ``BEGIN``, ``query_only``), so another process
holding the write lock delays no read. A write waits for the database at most
``busy_timeout`` seconds (or until the deadline of :func:`write_deadline`),
then raises :class:`LedgerBusy`; the API answers that with 503 and
``Retry-After``.

A write that crosses SQLite's checkpoint threshold (1,000 pages of WAL) copies
them into the database file before it returns: on a ledger of millions of
entries that stalls the writer for up to a second, every few dozen spawns. The
service therefore opens the ledger with ``background_checkpoints``: its writes
only checkpoint past a 10,000-page backstop, and a job checkpoints every few
seconds from a reader connection (:meth:`Ledger.checkpoint`), which never
blocks a write.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from .credits import DueCredit, capped
from .keys import MAX_KEY_BYTES, stored_key
from .units import from_milli, to_milli

log = logging.getLogger(__name__)

#: Current schema version; see ``MIGRATIONS`` and docs/ledger.md for the upgrade path.
SCHEMA_VERSION = 9

KINDS = ("grant", "monthly", "daily", "debit", "adjustment", "refund")
#: Kinds whose amount must be positive (credits) or negative (charges).
_POSITIVE = {"grant", "monthly", "daily", "refund"}
_NEGATIVE = {"debit"}

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY only

metadata = sa.MetaData()

meta_table = sa.Table(
    "gpupool_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

accounts = sa.Table(
    "gpupool_accounts",
    metadata,
    sa.Column("name", sa.Unicode(255), primary_key=True),
    sa.Column("balance_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # The last local day whose scheduled credits were applied (None: new account).
    sa.Column("credits_through", sa.Date, nullable=True),
)

entries = sa.Table(
    "gpupool_entries",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("account", sa.Unicode(255), sa.ForeignKey("gpupool_accounts.name"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("amount_milli", sa.BigInteger, nullable=False),
    # keys.stored_key: the key, or the hash of a key longer than keys.MAX_KEY_BYTES ...
    sa.Column("idempotency_key", sa.Unicode(1024), nullable=False, unique=True),
    sa.Column("reason", sa.UnicodeText, nullable=False, default=""),
    sa.Column("actor", sa.Unicode(255), nullable=False, default="system"),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("interval_start", sa.DateTime, nullable=True),
    sa.Column("interval_end", sa.DateTime, nullable=True),
    sa.Column("model", sa.Unicode(255), nullable=True),
    sa.Column("gpu_seconds", sa.Numeric(20, 3), nullable=True),
    # ... and then the full key here (None: the key is idempotency_key itself)
    sa.Column("key_text", sa.UnicodeText, nullable=True),
    sa.Index("ix_gpupool_entries_account_id", "account", "id"),
)

#: an entry's columns as ``Ledger._post`` writes them (the id is the database's)
ENTRY_COLUMNS = tuple(entries.c[n] for n in (
    "account", "kind", "amount_milli", "idempotency_key", "key_text", "reason", "actor", "created_at",
    "interval_start", "interval_end", "model", "gpu_seconds"))
#: rows bound in one PostgreSQL statement (``_arrays``): a debit cycle of 10,000 servers is one
BULK_ROWS = 10_000

# A closed interval of a periodic job (e.g. an hour of debits) is marked done
# in the same transaction as its entries: a crash leaves it either fully
# charged and marked, or untouched.
intervals = sa.Table(
    "gpupool_intervals",
    metadata,
    sa.Column("job", sa.String(64), primary_key=True),
    sa.Column("start", sa.DateTime, primary_key=True),
    sa.Column("end", sa.DateTime, nullable=False),
    sa.Column("completed_at", sa.DateTime, nullable=False),
    sa.Column("entries", sa.Integer, nullable=False, default=0),
)

# GPU allocations held by servers: the service's pool is rebuilt from the
# active ones at start-up, and the embedded usage source charges from them.
allocations = sa.Table(
    "gpupool_allocations",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("node", sa.Unicode(255), nullable=False),
    sa.Column("gpus", sa.JSON, nullable=False),  # [{"index", "uuid", "model", "milli", "mig_uuid"[, "mig_profile"]}]
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("price_per_hour_milli", sa.BigInteger, nullable=False),
    sa.Column("borrowed", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("released_at", sa.DateTime, nullable=True),
    sa.Column("release_reason", sa.UnicodeText, nullable=True),
    sa.Index("ix_gpupool_allocations_active", "released_at", "user"),
)

# Sub-milli-token remainders of debits, per account and model. Each debit is
# rounded to the milli-token and the remainder carried into the next one, so
# that the total charged never drifts from the exact cost, however short the
# debit interval (minute intervals would otherwise round 1/60 up 60 times).
carries = sa.Table(
    "gpupool_carries",
    metadata,
    sa.Column("account", sa.Unicode(255), primary_key=True),
    sa.Column("model", sa.Unicode(255), primary_key=True),
    sa.Column("residual", sa.String(64), nullable=False),  # a Decimal, exactly as computed
)

# Every cull action (warning, kernels shut down, server stopped), with its
# reason, whether it was a dry run, and who decided: the admins' audit trail.
audit = sa.Table(
    "gpupool_audit",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime, nullable=False),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("reason", sa.UnicodeText, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False, default=False),
    sa.Column("detail", sa.JSON, nullable=True),
    # one user's events, newest first: the notices in their ``GET me``, ``gpupool audit --user``
    sa.Index("ix_gpupool_audit_user", "user", "id"),
)

# Servers waiting for GPUs (the wait queue): kept here so that a restart of the
# service loses nobody's place. Reservations live in the pool only; the queue's
# dispatch makes them again after a restart.
queue = sa.Table(
    "gpupool_queue",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("request", sa.JSON, nullable=False),  # the placement request, models already narrowed
    sa.Column("requested_models", sa.JSON, nullable=True),
    sa.Column("priority", sa.Integer, nullable=False, default=1),
    sa.Column("since", sa.DateTime, nullable=False),
    sa.UniqueConstraint("user", "server", name="uq_gpupool_queue_user_server"),
)

# The devices (GPU and MIG instance UUIDs) each node's agent last reported: kept so that
# after a restart no other node's agent token can claim them before their node reports.
node_devices = sa.Table(
    "gpupool_node_devices",
    metadata,
    sa.Column("device", sa.Unicode(255), primary_key=True),
    sa.Column("node", sa.Unicode(255), nullable=False),
    sa.Column("reported_at", sa.DateTime, nullable=False),
)

# What users' GPUs did while held, per local day of the pool, user and team (the team the
# user counted against when it was measured): GPU-seconds held, busy and of unknown use, in
# thousandths (a 0.5 share held a minute is 30,000). Busy is the server's own use of its GPU
# or share, at most the share. Written by the gpu-use job, one interval at a time.
gpu_use = sa.Table(
    "gpupool_gpu_use",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("user", sa.Unicode(255), primary_key=True),
    sa.Column("team", sa.Unicode(255), primary_key=True),
    sa.Column("held_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("busy_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("unknown_milli", sa.BigInteger, nullable=False, default=0),
)


@dataclass(frozen=True)
class GpuUse:
    """One user's GPU time on one day (thousandths of GPU-seconds). ``held`` includes the
    busy and the unknown parts; idle is what is left."""

    day: date
    user: str
    team: str
    held_milli: int
    busy_milli: int
    unknown_milli: int

    @property
    def idle_milli(self) -> int:
        return self.held_milli - self.busy_milli - self.unknown_milli


class LedgerGpuUse:
    """The record of what users' GPUs did (``gpupool_gpu_use``). A base of :class:`Ledger`."""

    def _write(self) -> Any:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def record_gpu_use(self, rows: Iterable[GpuUse], interval: tuple[str, datetime, datetime],
                       *, now: datetime | None = None) -> bool:
        """Add one interval's measurements to the daily sums and mark the interval done, in
        one transaction; an interval already recorded adds nothing (False)."""
        job, start, end = interval
        with self._write() as conn:
            marked = conn.execute(_insert(conn, intervals).returning(intervals.c.job), dict(
                job=job, start=_db_time(start), end=_db_time(end), completed_at=_db_time(now or utcnow()),
                entries=0)).first()
            if marked is None:  # recorded before (rowcount is not to be trusted with ON CONFLICT everywhere)
                return False
            for r in rows:
                key = (gpu_use.c.day == r.day) & (gpu_use.c.user == r.user) & (gpu_use.c.team == r.team)
                added = {"held_milli": r.held_milli, "busy_milli": r.busy_milli, "unknown_milli": r.unknown_milli}
                done = conn.execute(gpu_use.update().where(key).values(
                    **{c: gpu_use.c[c] + v for c, v in added.items()}).returning(gpu_use.c.day)).first()
                if done is None:
                    conn.execute(gpu_use.insert().values(day=r.day, user=r.user, team=r.team, **added))
        return True


# Every start estimate the queue showed (once per waiting entry: the one shown when it
# joined) and the real start: the published accuracy of the estimates. Seconds after
# ``shown_at``; a bound of None is "not within the horizon".
estimates = sa.Table(
    "gpupool_estimates",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # the queue entry's id (the allocation's, once started)
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("shown_at", sa.DateTime, nullable=False),
    sa.Column("low_s", sa.Integer, nullable=True),
    sa.Column("mid_s", sa.Integer, nullable=True),
    sa.Column("high_s", sa.Integer, nullable=True),
    sa.Column("basis", sa.String(16), nullable=False),  # "history" or "fallback" (eta.py)
    sa.Column("started_at", sa.DateTime, nullable=True),
    # the release model's own point estimate (seconds) before calibration: what the next
    # estimates are calibrated on, against the real start (eta.Calibration)
    sa.Column("model_s", sa.Integer, nullable=True),
    sa.Index("ix_gpupool_estimates_started", "started_at"),
)


class LedgerRecords:
    """What the service records beside money, in the same database and transactions:
    the audit log of culling and fair share, and the wait queue. A base of
    :class:`Ledger`, which provides the connections (``_read``/``_write``)."""

    def _read(self) -> Connection:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def _write(self) -> Any:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def queue_add(self, entry: Mapping[str, Any], shown: Sequence[Any] | None = None) -> None:
        """Store a waiting server (keys as the ``gpupool_queue`` columns); with ``shown`` (the
        arguments of :meth:`estimate_shown`), the estimate it was shown, in the same transaction."""
        with self._write() as conn:
            conn.execute(queue.insert(), {**entry, "since": _db_time(entry["since"])})
            if shown is not None:
                self._estimate_shown(conn, *shown)

    def queue_remove(self, entry_id: str) -> None:
        with self._write() as conn:
            conn.execute(queue.delete().where(queue.c.id == entry_id))

    def queue_entries(self) -> list[dict[str, Any]]:
        """Every waiting server, oldest first."""
        with self._read() as conn:
            rows = conn.execute(sa.select(queue).order_by(queue.c.since, queue.c.id))
            return [{**r._mapping, "since": _aware(r.since)} for r in rows]

    def estimate_shown(self, entry_id: str, user: str, at: datetime, bounds: Sequence[int | None],
                       basis: str, model_s: int | None = None) -> None:
        """Record the estimate shown to a waiting entry (``bounds``: low, mid, high seconds
        after ``at``; ``model_s``: the model's own estimate). Idempotent: the first one shown stays."""
        with self._write() as conn:
            self._estimate_shown(conn, entry_id, user, at, bounds, basis, model_s)

    @staticmethod
    def _estimate_shown(conn: Connection, entry_id: str, user: str, at: datetime, bounds: Sequence[int | None],
                        basis: str, model_s: int | None = None) -> None:
        low, mid, high = bounds  # the first one shown stays: a second is ignored, in one round trip
        conn.execute(_insert(conn, estimates), dict(id=entry_id, user=user, shown_at=_db_time(at), low_s=low,
                                                    mid_s=mid, high_s=high, basis=basis, model_s=model_s))

    def estimate_started(self, entry_id: str, at: datetime) -> None:
        """The entry really started (its GPUs were claimed); once: a second call keeps the first time."""
        with self._write() as conn:
            conn.execute(estimates.update().where(estimates.c.id == entry_id, estimates.c.started_at.is_(None))
                         .values(started_at=_db_time(at)))

    def estimates_started(self, since: datetime) -> list[tuple[int | None, int | None, int | None, float]]:
        """(low, mid, high, real wait) in seconds of each shown estimate whose entry started since ``since``."""
        q = sa.select(estimates.c.low_s, estimates.c.mid_s, estimates.c.high_s, estimates.c.shown_at,
                      estimates.c.started_at).where(estimates.c.started_at >= _db_time(since))
        with self._read() as conn:
            return [(r.low_s, r.mid_s, r.high_s, (r.started_at - r.shown_at).total_seconds()) for r in conn.execute(q)]

    def calibration_pairs(self, since: datetime, limit: int) -> list[tuple[int, float]]:
        """(the model's estimate, the real wait) in seconds of the ``limit`` latest starts since
        ``since`` that had one, oldest first: what the next ranges are calibrated on."""
        q = (sa.select(estimates.c.model_s, estimates.c.shown_at, estimates.c.started_at)
             .where(estimates.c.started_at >= _db_time(since), estimates.c.model_s.is_not(None))
             .order_by(estimates.c.started_at.desc()).limit(limit))
        with self._read() as conn:
            rows = conn.execute(q).all()
        return [(r.model_s, (r.started_at - r.shown_at).total_seconds()) for r in reversed(rows)]

    def session_lengths(self, since: datetime) -> list[tuple[dict[str, Any], str, float]]:
        """(request, user, seconds held) of each allocation released since ``since``: the history
        the wait estimates learn from."""
        q = sa.select(allocations.c.request, allocations.c.user, allocations.c.created_at,
                      allocations.c.released_at).where(allocations.c.released_at >= _db_time(since))
        with self._read() as conn:
            return [(dict(r.request), r.user, (r.released_at - r.created_at).total_seconds())
                    for r in conn.execute(q)]

    def node_devices(self) -> dict[str, str]:
        """Every remembered device UUID and the node that reported it."""
        with self._read() as conn:
            return {device: node for device, node in conn.execute(sa.select(node_devices.c.device,
                                                                            node_devices.c.node))}

    def set_node_devices(self, node: str, devices: Iterable[str], at: datetime) -> None:
        """Node ``node`` has exactly ``devices`` now (a device another node had is its now)."""
        devices = sorted(set(devices))
        with self._write() as conn:
            conn.execute(node_devices.delete().where(node_devices.c.node == node))
            for chunk in _chunks(devices):
                conn.execute(node_devices.delete().where(node_devices.c.device.in_(chunk)))
            rows = [dict(device=d, node=node, reported_at=_db_time(at)) for d in devices]
            for chunk in _chunks(rows):
                conn.execute(node_devices.insert(), list(chunk))

    def add_audit(self, event: AuditEvent) -> AuditEvent:
        with self._write() as conn:
            new_id = conn.execute(audit.insert().values(
                at=_db_time(event.at), user=event.user, server=event.server, action=event.action,
                reason=event.reason, dry_run=event.dry_run, detail=event.detail,
            )).inserted_primary_key[0]
        return AuditEvent(**{**event.__dict__, "id": new_id})

    def _audit_query(self, q: sa.Select) -> list[AuditEvent]:  # type: ignore[type-arg]
        with self._read() as conn:
            return [AuditEvent(id=r.id, at=_aware(r.at), user=r.user, server=r.server, action=r.action,
                               reason=r.reason, dry_run=bool(r.dry_run), detail=r.detail) for r in conn.execute(q)]

    def audit_log(self, *, limit: int = 100, before: int | None = None, user: str | None = None) -> list[AuditEvent]:
        """Audit events, newest first; ``before`` = the last id of the previous page."""
        q = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
        if before is not None:
            q = q.where(audit.c.id < before)
        if user is not None:
            q = q.where(audit.c.user == user)
        return self._audit_query(q)

    def audit_latest(self, actions: Iterable[str], *, dry_run: bool = False) -> list[AuditEvent]:
        """The newest event among ``actions`` per (user, server), oldest first: what the
        service must remember of its own enforcement after a restart."""
        newest = (
            sa.select(sa.func.max(audit.c.id))
            .where(audit.c.action.in_(list(actions)), audit.c.dry_run.is_(dry_run))
            .group_by(audit.c.user, audit.c.server)
        )
        q = sa.select(audit).where(audit.c.id.in_(newest.scalar_subquery())).order_by(audit.c.id)
        return self._audit_query(q)

    def audit_of_user(self, user: str, actions: Iterable[str], *, limit: int = 200) -> list[AuditEvent]:
        """A user's non-dry-run events among ``actions``, newest first (their notices)."""
        q = (sa.select(audit).where(audit.c.user == user, audit.c.action.in_(list(actions)),
                                    audit.c.dry_run.is_(False)).order_by(audit.c.id.desc()).limit(limit))
        return self._audit_query(q)

    def audit_event(self, event_id: int) -> AuditEvent | None:
        found = self._audit_query(sa.select(audit).where(audit.c.id == event_id))
        return found[0] if found else None

    def audit_events(self, actions: Iterable[str], *, since: datetime | None = None) -> list[AuditEvent]:
        """Every non-dry-run event among ``actions`` (since ``since``), oldest first."""
        q = sa.select(audit).where(audit.c.action.in_(list(actions)), audit.c.dry_run.is_(False)).order_by(audit.c.id)
        if since is not None:
            q = q.where(audit.c.at >= _db_time(since))
        return self._audit_query(q)


class LedgerLeases:
    """Leases in the meta table: which of several services on one ledger runs the
    periodic jobs (``service/core/lease.py``)."""

    def _write(self) -> Any:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def claim_lease(self, name: str, holder: str, ttl: float, *, now: datetime | None = None,
                    holder_gone: Callable[[str], bool] = lambda _h: False) -> str:
        """Take or renew the lease ``name`` for ``holder``; the holder it has afterwards.

        Kept in the meta table as ``holder|expiry`` (one row, one transaction), so two
        services on one ledger agree on who runs the periodic jobs without a schema
        change. A lease is free once it expired, or when ``holder_gone`` says its holder
        no longer exists (a process of this host that was killed)."""
        now = now or utcnow()
        key = f"lease:{name}"[:64]
        with self._write() as conn:
            q = sa.select(meta_table.c.value).where(meta_table.c.key == key)
            if conn.dialect.name == "postgresql":
                q = q.with_for_update()
            row = conn.execute(q).first()
            if row is not None:
                current, _, until = row[0].rpartition("|")
                expired = datetime.fromisoformat(until) <= now if until else True
                if current != holder and not expired and not holder_gone(current):
                    return current
            value = f"{holder}|{(now + timedelta(seconds=ttl)).isoformat()}"[:255]
            if row is None:
                conn.execute(_insert(conn, meta_table).values(key=key, value=value))
                won = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == key)).scalar_one()
                return won.rpartition("|")[0]
            conn.execute(meta_table.update().where(meta_table.c.key == key).values(value=value))
            return holder

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up at a clean stop, so a successor need not wait for it to expire."""
        key = f"lease:{name}"[:64]
        with self._write() as conn:
            value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == key)).scalar()
            if value is not None and value.rpartition("|")[0] == holder:
                conn.execute(meta_table.delete().where(meta_table.c.key == key))


class LedgerHeldReads:
    """Light reads of the allocations, for what is asked often or of a large pool: the wait
    queue's order at every dispatch, the admin pool map, the owners of an hour's Slurm jobs.
    A base of :class:`Ledger`."""

    def _read(self) -> Connection:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def active_allocations_on(self, *, nodes: Iterable[str] | None = None,
                              newest: int | None = None) -> list[AllocationRecord]:
        """Held allocations, newest first: those on ``nodes``, or the ``newest`` few. The admin
        pool map lists a page of them; parsing all 5,000 of a large pool costs it 100 ms."""
        q = (sa.select(allocations).where(allocations.c.released_at.is_(None))
             .order_by(allocations.c.created_at.desc(), allocations.c.id))
        if nodes is not None:
            q = q.where(allocations.c.node.in_(sorted(set(nodes))))
        if newest is not None:
            q = q.limit(newest)
        with self._read() as conn:
            return [_allocation(r) for r in conn.execute(q)]

    def active_holders(self) -> dict[str, tuple[str, str, bool]]:
        """Each held allocation's (user, server, borrowed), by id: who holds what on the pool
        map, without parsing every allocation's GPUs and request."""
        q = (sa.select(allocations.c.id, allocations.c.user, allocations.c.server, allocations.c.borrowed)
             .where(allocations.c.released_at.is_(None)))
        with self._read() as conn:
            return {i: (user, server, bool(borrowed)) for i, user, server, borrowed in conn.execute(q)}

    def held_servers(self) -> dict[str, int]:
        """How many allocations each user holds now: the wait queue's fair order counts them at
        every dispatch, so one grouped count (from the active index), not every record parsed."""
        q = (sa.select(allocations.c.user, sa.func.count()).where(allocations.c.released_at.is_(None))
             .group_by(allocations.c.user))
        with self._read() as conn:
            return {user: count for user, count in conn.execute(q)}

    def allocation_owners(self, alloc_ids: Iterable[str]) -> dict[str, str]:
        """The user of each of ``alloc_ids`` the ledger has, held or released (the others are left
        out), in one query per 500 ids: charging an hour of 5,000 Slurm jobs one
        :meth:`~Ledger.allocation` read at a time took 9 s on PostgreSQL."""
        out: dict[str, str] = {}
        with self._read() as conn:
            for chunk in _chunks(sorted(set(alloc_ids))):
                q = sa.select(allocations.c.id, allocations.c.user).where(allocations.c.id.in_(list(chunk)))
                out.update({alloc_id: user for alloc_id, user in conn.execute(q)})
        return out


class LedgerError(RuntimeError):
    """The ledger cannot be used (schema too new, database unreachable)."""


class LedgerBusy(LedgerError):
    """A write could not get the database within its time bound (another writer holds
    the lock). Nothing was written by the transaction that raised it; retry later.

    ``retry_after`` is a suggestion in whole seconds for the ``Retry-After`` header."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


class IdempotencyConflict(ValueError):
    """The key was already used for a different entry: a bug or a replayed request with other content."""


class UnknownAccount(LookupError):
    pass


#: PostgreSQL states that mean "busy, try again": lock_not_available, query_canceled
#: (lock_timeout/statement_timeout), deadlock_detected, serialization_failure
_BUSY_SQLSTATES = frozenset({"55P03", "57014", "40P01", "40001"})


def is_database_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says the database was busy (as opposed to broken or a bug).

    The service answers these with 503 and Retry-After: SQLite's "database is
    locked"/"database is busy" past ``busy_timeout``, PostgreSQL's lock and
    statement timeouts, an exhausted connection pool, or :class:`LedgerBusy`.
    """
    if isinstance(exc, (LedgerBusy, sa.exc.TimeoutError)):
        return True
    if isinstance(exc, sa.exc.OperationalError):
        orig = exc.orig
        if getattr(orig, "sqlstate", None) in _BUSY_SQLSTATES:
            return True
        text = str(orig).lower()
        return "database is locked" in text or "database is busy" in text or "database table is locked" in text
    return False


#: PostgreSQL states that mean "the server is not there": admin_shutdown, crash_shutdown,
#: cannot_connect_now (starting up or shutting down), too_many_connections; and class 08,
#: connection_exception
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

UNAVAILABLE_MESSAGE = "the ledger database cannot be reached; nothing was changed, try again in a few seconds"


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database server is down or unreachable (not a bug, not
    the caller's fault): the service answers these with 503 and Retry-After, like a
    busy database. A refused or dropped PostgreSQL connection, a server shutting down,
    a SQLite file that cannot be opened."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, sa.exc.OperationalError) or is_database_busy(exc):
        return False
    orig = exc.orig
    state = getattr(orig, "sqlstate", None) or ""
    if state.startswith("08") or state in _UNAVAILABLE_SQLSTATES:
        return True
    if not state and type(orig).__module__.startswith("psycopg"):
        return True  # failed before the server said anything: refused, unknown host, timed out
    return "unable to open database file" in str(orig).lower()


@dataclass(frozen=True)
class Posting:
    """An entry to record. ``amount`` is signed: debits are negative."""

    account: str
    kind: str
    amount: Decimal
    key: str
    reason: str = ""
    actor: str = "system"
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    model: str | None = None
    gpu_seconds: Decimal | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown entry kind {self.kind!r}; expected one of {KINDS}")
        if self.kind in _POSITIVE and self.amount <= 0:
            raise ValueError(f"a {self.kind} must be positive, got {self.amount}")
        if self.kind in _NEGATIVE and self.amount > 0:
            raise ValueError(f"a {self.kind} must not be positive, got {self.amount}")
        if not self.key:
            raise ValueError("an entry needs an idempotency key")
        to_milli(self.amount)  # refuse sub-milli amounts early


@dataclass(frozen=True)
class Entry:
    id: int
    account: str
    kind: str
    amount: Decimal
    key: str
    reason: str
    actor: str
    created_at: datetime
    interval_start: datetime | None
    interval_end: datetime | None
    model: str | None
    gpu_seconds: Decimal | None


@dataclass(frozen=True)
class Posted:
    """The outcome of one posting: the recorded entry (the first one, on a replay)."""

    entry: Entry
    created: bool


@dataclass(frozen=True)
class Credited:
    """What ``apply_credits`` did: the postings' outcomes, and the balance they left (read in
    the same transaction, so the spawn that asked needs no second read)."""

    posted: list[Posted]
    balance: Decimal


@dataclass(frozen=True)
class Account:
    name: str
    balance: Decimal
    created_at: datetime
    credits_through: date | None


@dataclass(frozen=True)
class AllocationRecord:
    """A server's hold on GPUs; ``released_at`` is None while it is held."""

    id: str
    user: str
    server: str
    node: str
    gpus: tuple[dict, ...]  # type: ignore[type-arg]
    request: dict  # type: ignore[type-arg]
    price_per_hour: Decimal
    borrowed: bool
    created_at: datetime
    released_at: datetime | None = None
    release_reason: str | None = None


@dataclass(frozen=True)
class AuditEvent:
    at: datetime
    user: str
    server: str
    action: str  # "warn" | "clear_warning" | "cull_kernels" | "stop_server" | "failed"
    reason: str
    dry_run: bool = False
    detail: dict | None = None  # type: ignore[type-arg]
    id: int | None = None


@dataclass(frozen=True)
class Mismatch:
    account: str
    stored: Decimal
    computed: Decimal


@dataclass(frozen=True)
class VerifyReport:
    accounts: int
    entries: int
    mismatches: tuple[Mismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _db_time(value: datetime | None) -> datetime | None:
    """Store naive UTC: the same value on every backend."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError(f"timestamps must be timezone-aware, got {value!r}")
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def _aware(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=timezone.utc)


def normalize_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here (the driver we ship), not psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


#: Default seconds a write waits for the database lock before raising LedgerBusy.
DEFAULT_BUSY_TIMEOUT = 5.0
#: WAL pages after which a write checkpoints itself, when checkpoints run in the background
BACKSTOP_CHECKPOINT_PAGES = 10_000

BUSY_MESSAGE = ("the ledger database is busy: another writer holds its lock; nothing was changed, "
                "try again in a few seconds")

_deadline = threading.local()


@contextmanager
def write_deadline(deadline: float | None) -> Iterator[None]:
    """Writes in this thread give up at ``deadline`` (``time.monotonic()``), not after
    a full busy timeout each: a request queued behind others keeps one overall bound."""
    previous = getattr(_deadline, "value", None)
    _deadline.value = deadline
    try:
        yield
    finally:
        _deadline.value = previous


def _wait_ms(busy_timeout: float) -> int:
    """How long the next transaction of this thread may wait for the lock, in ms."""
    deadline = getattr(_deadline, "value", None)
    if deadline is None:
        return int(busy_timeout * 1000)
    left = deadline - time.monotonic()
    if left <= 0:
        raise LedgerBusy(BUSY_MESSAGE, math.ceil(busy_timeout))
    return max(1, int(left * 1000))


def _is_memory(url: sa.engine.URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def make_engine(url: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, reader: bool = False,
                autocheckpoint: int | None = None, **kwargs: object) -> Engine:
    """An engine for writes (``reader=False``) or for reads only.

    An in-memory SQLite database is one shared connection (``StaticPool``): every
    thread must see the same database, and the service core runs in threads.
    ``autocheckpoint``: SQLite's ``wal_autocheckpoint`` for these connections (None:
    SQLite's own 1,000 pages)."""
    url = normalize_url(url)
    parsed = sa.engine.make_url(url)
    if _is_memory(parsed):
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}, **kwargs}
    elif parsed.get_backend_name() == "postgresql":
        # a write waits for row locks at most busy_timeout, then fails with 55P03 (LedgerBusy)
        options = f"-c lock_timeout={int(busy_timeout * 1000)}"
        kwargs = {"connect_args": {"options": options}, **kwargs}
    engine = sa.create_engine(url, **kwargs)  # type: ignore[arg-type]
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, busy_timeout, reader, autocheckpoint)
    return engine


def _configure_sqlite(engine: Engine, busy_timeout: float, reader: bool, autocheckpoint: int | None) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not the driver, open transactions, so BEGIN IMMEDIATE below is ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
            if autocheckpoint is not None:
                cur.execute(f"PRAGMA wal_autocheckpoint={int(autocheckpoint)}")
        if reader:
            cur.execute("PRAGMA query_only=ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        if reader:
            # A deferred transaction: one consistent snapshot, and in WAL mode it
            # never waits for a writer (only BEGIN IMMEDIATE takes the write lock).
            conn.exec_driver_sql("BEGIN")
            return
        # Take the write lock at the start: two processes posting at once then
        # queue instead of failing half-way with "database is locked"; wait for
        # it no longer than this thread's deadline allows.
        conn.exec_driver_sql(f"PRAGMA busy_timeout={_wait_ms(busy_timeout)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _insert(conn: Connection, table: sa.Table):  # type: ignore[no-untyped-def]
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect (built once per dialect:
    statements are immutable, ``.values()`` and ``.returning()`` answer copies)."""
    key = (conn.dialect.name, table.name)
    built = _INSERTS.get(key)
    if built is None:
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:  # pragma: no cover - documented as unsupported
            raise LedgerError(f"unsupported database {conn.dialect.name!r}; use SQLite or PostgreSQL")
        built = _INSERTS[key] = insert(table).on_conflict_do_nothing()
    return built


_INSERTS: dict[tuple[str, str], Any] = {}

# Statements of every spawn, built once with bound parameters: building one (SQLAlchemy's
# coercion of each clause) cost about as much as running it, 0.15 ms a statement here.
_ACCOUNT = sa.select(accounts).where(accounts.c.name == sa.bindparam("name"))
_HELD = (sa.select(allocations).where(allocations.c.released_at.is_(None))
         .order_by(allocations.c.created_at))
_HELD_BY = _HELD.where(allocations.c.user == sa.bindparam("user"))
_ADD_TO_BALANCE = (accounts.update().where(accounts.c.name == sa.bindparam("account"))
                   .values(balance_milli=accounts.c.balance_milli + sa.bindparam("delta")))

#: one entry row (named as ``ENTRY_COLUMNS``), its id back if its key is new
_ONE_ENTRY = sa.text(
    f"INSERT INTO {entries.name} ({', '.join(c.name for c in ENTRY_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c.name for c in ENTRY_COLUMNS)}) ON CONFLICT DO NOTHING RETURNING id, idempotency_key",
).bindparams(*(sa.bindparam(c.name, type_=c.type) for c in ENTRY_COLUMNS))


def _insert_entries(conn: Connection, rows: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Insert entry rows (values in ``ENTRY_COLUMNS`` order) whose keys are new: {stored key: id}.

    Not SQLAlchemy's ``executemany``: for a debit cycle's 10,000 rows its per-row parameter
    work was most of the write, and psycopg parses each of its 500-row ``VALUES`` batches anew.
    SQLite gets the driver's own ``executemany``; PostgreSQL one statement over typed arrays.
    """
    names = ", ".join(c.name for c in ENTRY_COLUMNS)
    if len(rows) == 1:  # a grant or a credit: one plain statement, one round trip
        got = conn.execute(_ONE_ENTRY, dict(zip((c.name for c in ENTRY_COLUMNS), rows[0]))).first()
        return {} if got is None else {got[1]: got[0]}
    if conn.dialect.name == "sqlite":
        # the accounts were ensured first, so this transaction holds SQLite's one write lock:
        # the rows past the largest id before the insert are this batch's
        last = conn.execute(sa.select(sa.func.max(entries.c.id))).scalar() or 0
        marks = ", ".join("?" * len(ENTRY_COLUMNS))
        conn.exec_driver_sql(f"INSERT INTO {entries.name} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                             _bound(conn, ENTRY_COLUMNS, rows))
        new = conn.execute(sa.select(entries.c.id, entries.c.idempotency_key).where(entries.c.id > last))
        return {key: new_id for new_id, key in new}
    new_ids: dict[str, int] = {}
    for chunk in _chunks(rows, BULK_ROWS):
        arrays, params = _arrays(conn, ENTRY_COLUMNS, chunk)
        stmt = sa.text(f"INSERT INTO {entries.name} ({names}) SELECT * FROM unnest({arrays}) "
                       "ON CONFLICT DO NOTHING RETURNING id, idempotency_key")
        for new_id, key in conn.execute(stmt, params):
            new_ids[key] = new_id
    return new_ids


def _add_to_balances(conn: Connection, changes: Sequence[tuple[str, int]]) -> None:
    """``balance_milli += delta`` for each (account, delta), as ``_insert_entries`` writes rows."""
    table = accounts.name
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"UPDATE {table} SET balance_milli = balance_milli + ? WHERE name = ?",
                             [(d, n) for n, d in changes])
        return
    if len(changes) == 1:
        conn.execute(_ADD_TO_BALANCE, {"account": changes[0][0], "delta": changes[0][1]})
        return
    for chunk in _chunks(changes, BULK_ROWS):
        arrays, params = _arrays(conn, (accounts.c.name, accounts.c.balance_milli), chunk)
        conn.execute(sa.text(f"UPDATE {table} SET balance_milli = {table}.balance_milli + d.delta "
                             f"FROM unnest({arrays}) AS d(name, delta) WHERE {table}.name = d.name"), params)


def _bound(conn: Connection, columns: Sequence[sa.Column], rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows as the driver takes them: each value converted as its column's type binds it
    (SQLite's times become text), each distinct value once (a batch shares a few times)."""
    dialect = conn.dialect
    values = [list(column) for column in zip(*rows)]
    for i, column in enumerate(columns):
        convert = column.type.dialect_impl(dialect).bind_processor(dialect)
        if convert is not None:
            done: dict[Any, Any] = {v: None if v is None else convert(v) for v in set(values[i])}
            values[i] = [done[v] for v in values[i]]
    return list(zip(*values))


def _arrays(conn: Connection, columns: Sequence[sa.Column], rows: Sequence[Sequence[Any]]) -> tuple[str, dict[str, Any]]:
    """PostgreSQL: one bound array a column, cast to the column's type, for ``unnest``."""
    casts = ", ".join(f"CAST(:c{i} AS {c.type.compile(dialect=conn.dialect)}[])" for i, c in enumerate(columns))
    return casts, {f"c{i}": [row[i] for row in rows] for i in range(len(columns))}


def _chunks(items: Sequence, size: int = 500) -> Iterator[Sequence]:  # type: ignore[type-arg]
    for i in range(0, len(items), size):
        yield items[i : i + size]


# ---------------------------------------------------------------- migrations

def _migrate_to_1(conn: Connection) -> None:
    metadata.create_all(conn, tables=[accounts, entries, intervals])


#: version -> step that upgrades from version-1. Add a step (and bump
#: SCHEMA_VERSION) for every schema change; never edit a released step.
def _migrate_to_2(conn: Connection) -> None:
    metadata.create_all(conn, tables=[allocations, carries])


def _migrate_to_3(conn: Connection) -> None:
    metadata.create_all(conn, tables=[audit])


def _migrate_to_4(conn: Connection) -> None:
    metadata.create_all(conn, tables=[queue])


def _migrate_to_5(conn: Connection) -> None:
    # a database made at version 3 or later has the audit table without this index;
    # one made from scratch got it with the table in step 3
    for index in audit.indexes:
        index.create(conn, checkfirst=True)


def _migrate_to_6(conn: Connection) -> None:
    # long keys are stored hashed, the full key beside them (keys.stored_key); nodes'
    # devices are remembered (node_devices). A database made from scratch has both already.
    if "key_text" not in {c["name"] for c in sa.inspect(conn).get_columns("gpupool_entries")}:
        conn.execute(sa.text("ALTER TABLE gpupool_entries ADD COLUMN key_text TEXT"))
    metadata.create_all(conn, tables=[node_devices])
    # SQLite took keys of any length before: store those the way a replay now looks them up
    long_keys = sa.select(entries.c.id, entries.c.idempotency_key).where(sa.or_(
        sa.func.length(entries.c.idempotency_key) > MAX_KEY_BYTES // 4,  # 4 bytes a character at most
        entries.c.idempotency_key.like("sha256:%")))
    for entry_id, key in conn.execute(long_keys).all():
        if stored_key(key) != key:
            conn.execute(entries.update().where(entries.c.id == entry_id)
                         .values(idempotency_key=stored_key(key), key_text=key))


def _migrate_to_7(conn: Connection) -> None:
    metadata.create_all(conn, tables=[gpu_use])


def _migrate_to_8(conn: Connection) -> None:
    # the queue's shown estimates and real starts (their published accuracy)
    metadata.create_all(conn, tables=[estimates])


def _migrate_to_9(conn: Connection) -> None:
    # the model's own estimate beside each shown one: the service calibrates on it
    if "model_s" not in {c["name"] for c in sa.inspect(conn).get_columns("gpupool_estimates")}:
        conn.execute(sa.text("ALTER TABLE gpupool_estimates ADD COLUMN model_s INTEGER"))


MIGRATIONS = {1: _migrate_to_1, 2: _migrate_to_2, 3: _migrate_to_3, 4: _migrate_to_4, 5: _migrate_to_5,
              6: _migrate_to_6, 7: _migrate_to_7, 8: _migrate_to_8, 9: _migrate_to_9}


def schema_version(conn: Connection) -> int:
    row = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")).first()
    return int(row[0]) if row else 0


def migrate(engine: Engine) -> int:
    """Bring the schema to ``SCHEMA_VERSION``; refuse a database newer than this code."""
    with engine.begin() as conn:
        meta_table.create(conn, checkfirst=True)
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger database has schema version {current}, newer than this gpupool_hub "
                f"understands ({SCHEMA_VERSION}); upgrade gpupool_hub"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            log.info("Upgrading the ledger schema to version %d", version)
            MIGRATIONS[version](conn)
        if current != SCHEMA_VERSION:
            if current == 0:
                conn.execute(meta_table.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
            else:
                conn.execute(
                    meta_table.update().where(meta_table.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
                )
    return SCHEMA_VERSION


# -------------------------------------------------------------------- ledger

def _entry(row: sa.Row) -> Entry:  # type: ignore[type-arg]
    m = row._mapping
    return Entry(
        id=m["id"],
        account=m["account"],
        kind=m["kind"],
        amount=from_milli(m["amount_milli"]),
        key=m["key_text"] or m["idempotency_key"],
        reason=m["reason"],
        actor=m["actor"],
        created_at=_aware(m["created_at"]),  # type: ignore[arg-type]
        interval_start=_aware(m["interval_start"]),
        interval_end=_aware(m["interval_end"]),
        model=m["model"],
        gpu_seconds=None if m["gpu_seconds"] is None else Decimal(m["gpu_seconds"]),
    )


def _same(entry: Entry, posting: Posting) -> bool:
    return (entry.account, entry.kind, entry.amount) == (posting.account, posting.kind, posting.amount)


class LedgerCarries:
    """The debit remainders carried to each user's next debit on a model (so that debits
    rounded to the milli-token add up exactly), written in the debit's own transaction.
    A base of :class:`Ledger`."""

    def _read(self) -> Connection:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def _store_carry(self, conn: Connection, carry: Mapping[tuple[str, str], Decimal]) -> None:
        keys = list(carry)
        for chunk in _chunks(keys):
            conn.execute(carries.delete().where(
                sa.tuple_(carries.c.account, carries.c.model).in_([tuple(k) for k in chunk])))
        rows = [dict(account=a, model=m, residual=str(v)) for (a, m), v in carry.items() if v]
        for chunk in _chunks(rows):
            conn.execute(carries.insert(), list(chunk))

    def carries(self) -> dict[tuple[str, str], Decimal]:
        """Every stored debit remainder (small: one row per user and model that had one)."""
        with self._read() as conn:
            return {(r.account, r.model): Decimal(r.residual) for r in conn.execute(sa.select(carries))}


class LedgerIntervals:
    """Which intervals each periodic job (debit, gpu-use) has completed: written in the
    same transaction as the interval's entries, read to find the next one. A base of
    :class:`Ledger`."""

    def _read(self) -> Connection:  # provided by Ledger
        raise NotImplementedError("Subclass must provide implementation")

    def interval_done(self, job: str, start: datetime) -> bool:
        with self._read() as conn:
            return conn.execute(
                sa.select(intervals.c.job).where(intervals.c.job == job, intervals.c.start == _db_time(start))
            ).first() is not None

    def last_interval(self, job: str) -> tuple[datetime, datetime] | None:
        """The most recent completed interval of ``job``, or None."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(intervals.c.start, intervals.c.end, intervals.c.completed_at)
                .where(intervals.c.job == job)
                .order_by(intervals.c.start.desc())
                .limit(1)
            ).first()
        return None if row is None else (_aware(row[0]), _aware(row[1]))  # type: ignore[return-value]


class Ledger(LedgerRecords, LedgerLeases, LedgerGpuUse, LedgerHeldReads, LedgerCarries, LedgerIntervals):
    """Append-only token ledger over any SQLAlchemy URL (SQLite or PostgreSQL)."""

    def __init__(self, url: str = "sqlite:///gpupool.sqlite", *, engine: Engine | None = None,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT, background_checkpoints: bool = False) -> None:
        """``background_checkpoints``: the caller runs :meth:`checkpoint` every few seconds, so
        writes need not (see the module docstring); for a long-lived process only."""
        self.busy_timeout = busy_timeout
        self.engine = engine or make_engine(
            url, busy_timeout=busy_timeout,
            autocheckpoint=BACKSTOP_CHECKPOINT_PAGES if background_checkpoints else None)
        # SQLite files get reader connections of their own (see the module docstring);
        # an in-memory database is one connection, and PostgreSQL readers never wait anyway.
        self.concurrent_reads = self.engine.dialect.name != "sqlite" or not _is_memory(self.engine.url)
        self._own_reader = self.engine.dialect.name == "sqlite" and self.concurrent_reads
        self.reader: Engine
        if self._own_reader:
            self.reader = make_engine(self.engine.url.render_as_string(hide_password=False),
                                      busy_timeout=busy_timeout, reader=True)
        elif self.engine.dialect.name == "postgresql":
            # The writer's pool, without a transaction: at READ COMMITTED each statement sees
            # its own snapshot in a transaction too, and BEGIN and ROLLBACK were two more
            # round trips for every read (a spawn reads twice, every GET me once).
            self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        else:
            self.reader = self.engine
        self._epoch: datetime | None = None
        migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()
        if self._own_reader:
            self.reader.dispose()

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction; ``LedgerBusy`` when the database stays locked too long."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa.exc.OperationalError as e:
            if not is_database_busy(e):
                raise
            raise LedgerBusy(BUSY_MESSAGE, math.ceil(self.busy_timeout)) from e

    def _read(self) -> Connection:
        """A connection for reads only: never waits for a writer."""
        return self.reader.connect()

    def checkpoint(self) -> int:
        """Copy the SQLite write-ahead log into the database file as far as no reader still
        needs it (``PASSIVE``: it never waits for, nor blocks, a writer). The WAL pages left
        behind; 0 on PostgreSQL and in-memory databases, which have none."""
        if not self._own_reader:
            return 0
        with self.reader.connect() as conn:
            busy, logged, copied = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
        return max(0, logged - copied) if logged >= 0 else 0

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
    ) -> list[Posted]:
        """Record entries in one transaction: all of them or none.

        Replayed keys are not recorded again; a key reused for a different
        entry raises ``IdempotencyConflict`` and nothing of the batch is kept.
        ``complete_interval=(job, start, end)`` marks that job interval done in
        the same transaction; ``carry`` stores debit remainders (see ``carries``)
        in it too.
        """
        now = now or utcnow()
        with self._write() as conn:
            results = self._post(conn, postings, now)
            if complete_interval is not None:
                job, start, end = complete_interval
                conn.execute(
                    _insert(conn, intervals),
                    dict(job=job, start=_db_time(start), end=_db_time(end), completed_at=_db_time(now),
                         entries=sum(r.created for r in results)),
                )
            if carry:
                self._store_carry(conn, carry)
        return results

    def _ensure_accounts(self, conn: Connection, names: Iterable[str], now: datetime) -> None:
        # the names as one bound array, the time bound once: a debit cycle names 10,000
        # accounts that all exist, and a row each with its own time was a fifth of its write
        wanted = sorted(set(names))
        if not wanted:
            return
        if conn.dialect.name == "sqlite":
            rows, named = "SELECT value, 0, :t, NULL FROM json_each(:names) WHERE true", json.dumps(wanted)
        else:
            rows, named = "SELECT unnest(CAST(:names AS text[])), 0, :t, NULL", wanted
        stmt = sa.text(f"INSERT INTO {accounts.name} (name, balance_milli, created_at, credits_through) {rows} "
                       "ON CONFLICT DO NOTHING").bindparams(sa.bindparam("t", type_=sa.DateTime))
        conn.execute(stmt, {"names": named, "t": _db_time(now)})

    def _post(self, conn: Connection, postings: Sequence[Posting], now: datetime,
              ensured: bool = False) -> list[Posted]:
        """``ensured``: the caller opened the postings' accounts in this transaction already."""
        if not postings:
            return []
        keys = [p.key for p in postings]
        if len(set(keys)) != len(keys):
            raise IdempotencyConflict("the same idempotency key appears twice in one batch")
        if not ensured:
            self._ensure_accounts(conn, (p.account for p in postings), now)
        created_at = _db_time(now)
        # the debits of one interval share its start and end: each distinct time is converted once
        naive: dict[datetime | None, datetime | None] = {None: None}
        for p in postings:
            for t in (p.interval_start, p.interval_end):
                if t not in naive:
                    naive[t] = _db_time(t)
        stored = {p.key: stored_key(p.key) for p in postings}
        milli = [to_milli(p.amount) for p in postings]
        rows = [
            (p.account, p.kind, m, stored[p.key], None if stored[p.key] == p.key else p.key, p.reason, p.actor,
             created_at, naive[p.interval_start], naive[p.interval_end], p.model, p.gpu_seconds)
            for p, m in zip(postings, milli)
        ]
        new_ids = _insert_entries(conn, rows)
        inserted: dict[str, Entry] = {}
        deltas: dict[str, int] = defaultdict(int)
        aware = {t: _aware(v) for t, v in naive.items()}
        created = _aware(created_at)
        for p, m in zip(postings, milli):
            if stored[p.key] in new_ids:
                inserted[p.key] = Entry(
                    id=new_ids[stored[p.key]], account=p.account, kind=p.kind, amount=from_milli(m), key=p.key,
                    reason=p.reason, actor=p.actor, created_at=created,  # type: ignore[arg-type]
                    interval_start=aware[p.interval_start], interval_end=aware[p.interval_end],
                    model=p.model, gpu_seconds=p.gpu_seconds)  # what was written: no second read
                deltas[p.account] += m
        changes = [(n, d) for n, d in deltas.items() if d]
        if changes:
            _add_to_balances(conn, changes)
        replayed = [p for p in postings if p.key not in inserted]
        existing: dict[str, Entry] = {}
        for chunk in _chunks([stored[p.key] for p in replayed]):
            for row in conn.execute(sa.select(entries).where(entries.c.idempotency_key.in_(chunk))):
                entry = _entry(row)
                existing[entry.key] = entry
        results = []
        for p in postings:
            if p.key in inserted:
                results.append(Posted(inserted[p.key], True))
                continue
            first = existing.get(p.key)
            if first is None:  # pragma: no cover - the unique index makes this impossible
                raise LedgerError(f"entry {p.key!r} neither inserted nor found")
            if not _same(first, p):
                raise IdempotencyConflict(
                    f"idempotency key {p.key!r} was already used for a {first.kind} of {first.amount} "
                    f"to {first.account!r}; refusing a {p.kind} of {p.amount} to {p.account!r}"
                )
            results.append(Posted(first, False))
        return results

    def open_account(self, name: str, now: datetime | None = None) -> None:
        """Create an empty account if it does not exist (its grant comes from ``apply_credits``)."""
        with self._write() as conn:
            self._ensure_accounts(conn, [name], now or utcnow())

    def apply_credits(
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

        A new user's first spawn comes here before anything else, so an account this opens
        is opened already marked ``through`` with a known balance of 0: three statements
        fewer than for an account that exists (on PostgreSQL each is a round trip).
        """
        now = now or utcnow()
        with self._write() as conn:
            opened = conn.execute(_insert(conn, accounts).returning(accounts.c.name), dict(
                name=name, balance_milli=0, created_at=_db_time(now), credits_through=through)).first()
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
                posted = self._post(
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
        with self._read() as conn:
            value = conn.execute(
                sa.select(accounts.c.balance_milli).where(accounts.c.name == name)
            ).scalar_one_or_none()
        if value is None:
            raise UnknownAccount(name)
        return from_milli(value)

    def account(self, name: str) -> Account:
        with self._read() as conn:
            row = conn.execute(_ACCOUNT, {"name": name}).first()
        if row is None:
            raise UnknownAccount(name)
        return _account(row)

    def accounts(self, *, limit: int = 100, after: str | None = None) -> list[Account]:
        """Accounts by name, keyset-paginated (``after`` = last name of the previous page)."""
        q = sa.select(accounts).order_by(accounts.c.name).limit(limit)
        if after is not None:
            q = q.where(accounts.c.name > after)
        with self._read() as conn:
            return [_account(r) for r in conn.execute(q)]

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
        with self._read() as conn:
            return [_entry(r) for r in conn.execute(q)]

    def iter_entries(self, *, batch: int = 1000) -> Iterator[Entry]:
        """Every entry in id order, in pages (for exports)."""
        last = 0
        while True:
            with self._read() as conn:
                rows = conn.execute(
                    sa.select(entries).where(entries.c.id > last).order_by(entries.c.id).limit(batch)
                ).all()
            if not rows:
                return
            for row in rows:
                yield _entry(row)
            last = rows[-1]._mapping["id"]

    def epoch(self, now: datetime) -> datetime:
        """When this ledger started charging: the first debit interval begins here.

        Recorded once (the first caller's ``now``), so a restarted service
        neither charges the time before it was installed nor skips any after.
        """
        if self._epoch is None:
            with self._write() as conn:
                conn.execute(_insert(conn, meta_table),
                             dict(key="epoch", value=now.astimezone(timezone.utc).isoformat()))
                value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "epoch")).scalar_one()
            self._epoch = datetime.fromisoformat(value)
        return self._epoch

    # ---- allocations

    def add_allocation(self, record: AllocationRecord) -> None:
        with self._write() as conn:
            conn.execute(allocations.insert().values(
                id=record.id, user=record.user, server=record.server, node=record.node,
                gpus=list(record.gpus), request=record.request,
                price_per_hour_milli=to_milli(record.price_per_hour), borrowed=record.borrowed,
                created_at=_db_time(record.created_at), released_at=None,
            ))

    def release_allocation(self, alloc_id: str, *, at: datetime, reason: str) -> AllocationRecord | None:
        """Mark an allocation released (once: a second release keeps the first time and reason)."""
        with self._write() as conn:
            conn.execute(
                allocations.update()
                .where(allocations.c.id == alloc_id, allocations.c.released_at.is_(None))
                .values(released_at=_db_time(at), release_reason=reason)
            )
            row = conn.execute(sa.select(allocations).where(allocations.c.id == alloc_id)).first()
        return None if row is None else _allocation(row)

    def set_borrowed(self, alloc_id: str, borrowed: bool) -> None:
        """Re-classify a held allocation (fair share, after the quotas changed)."""
        with self._write() as conn:
            conn.execute(allocations.update().where(allocations.c.id == alloc_id).values(borrowed=borrowed))

    def set_allocation_gpus(self, alloc_id: str, gpus: Iterable[dict]) -> None:  # type: ignore[type-arg]
        """The devices a held allocation really got (a batch scheduler bound others than the pool chose)."""
        with self._write() as conn:
            conn.execute(allocations.update()
                         .where(allocations.c.id == alloc_id, allocations.c.released_at.is_(None))
                         .values(gpus=list(gpus)))

    def allocation(self, alloc_id: str) -> AllocationRecord | None:
        with self._read() as conn:
            row = conn.execute(sa.select(allocations).where(allocations.c.id == alloc_id)).first()
        return None if row is None else _allocation(row)

    def active_allocations(self, user: str | None = None) -> list[AllocationRecord]:
        with self._read() as conn:
            rows = conn.execute(_HELD) if user is None else conn.execute(_HELD_BY, {"user": user})
            return [_allocation(r) for r in rows]

    def allocations_overlapping(self, start: datetime, end: datetime) -> list[AllocationRecord]:
        """Allocations held at any moment of [start, end): what the embedded usage source charges."""
        q = sa.select(allocations).where(
            allocations.c.created_at < _db_time(end),
            sa.or_(allocations.c.released_at.is_(None), allocations.c.released_at > _db_time(start)),
        )
        with self._read() as conn:
            return [_allocation(r) for r in conn.execute(q)]

    # ---- accounts in bulk

    def balances(self, names: Iterable[str]) -> dict[str, Decimal]:
        """The balance of each of ``names`` that has an account (the others are left out), in
        one query per 500 names: the periodic jobs judge every holder, not one at a time."""
        wanted = sorted(set(names))
        out: dict[str, Decimal] = {}
        with self._read() as conn:
            for chunk in _chunks(wanted):
                rows = conn.execute(sa.select(accounts.c.name, accounts.c.balance_milli)
                                    .where(accounts.c.name.in_(list(chunk))))
                out.update((name, from_milli(milli)) for name, milli in rows)
        return out

    def credits_through_of(self, names: Iterable[str]) -> dict[str, date | None]:
        """``credits_through`` of each existing account among ``names`` (one query per 500)."""
        out: dict[str, date | None] = {}
        with self._read() as conn:
            for chunk in _chunks(sorted(set(names))):
                q = sa.select(accounts.c.name, accounts.c.credits_through).where(accounts.c.name.in_(chunk))
                out.update({name: through for name, through in conn.execute(q)})
        return out

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
        with self._read() as conn:
            for name, stored, total, n in conn.execute(q):
                n_accounts += 1
                n_entries += n or 0
                if int(stored) != int(total or 0):
                    mismatches.append(Mismatch(name, from_milli(stored), from_milli(int(total or 0))))
        return VerifyReport(n_accounts, n_entries, tuple(mismatches))


def _account(row: sa.Row) -> Account:  # type: ignore[type-arg]
    m = row._mapping
    return Account(
        name=m["name"],
        balance=from_milli(m["balance_milli"]),
        created_at=_aware(m["created_at"]),  # type: ignore[arg-type]
        credits_through=m["credits_through"],
    )


def _allocation(row: sa.Row) -> AllocationRecord:  # type: ignore[type-arg]
    m = row._mapping
    return AllocationRecord(
        id=m["id"], user=m["user"], server=m["server"], node=m["node"], gpus=tuple(m["gpus"]),
        request=dict(m["request"]), price_per_hour=from_milli(m["price_per_hour_milli"]),
        borrowed=bool(m["borrowed"]), created_at=_aware(m["created_at"]),  # type: ignore[arg-type]
        released_at=_aware(m["released_at"]), release_reason=m["release_reason"],
    )

# ---------------------------------------------------------------- read-only queries for the pages
#
# The pages summarise up to 90 days of a user's entries into a handful of daily
# numbers. Fetching 10,000 entries to add them up in Python costs most of the
# page's time budget (turning timestamps into datetimes alone takes ~100 ms),
# so the database adds them up per day and kind and returns a few hundred rows.
# They only read; the pages reach the database through them alone.


@dataclass(frozen=True)
class DayTotal:
    """Sums of a user's entries that fall on one day (by when they were posted) and,
    for debits, were used on one day (by the start of the charged interval)."""

    day: int  # index of the day the entries were posted on: 0 = the first day shown
    used_day: int  # debits: index of the day the GPU time was used (earlier usage counts as day 0)
    kind: str
    model: str | None
    credit_milli: int  # sum of the positive amounts
    debit_milli: int  # sum of the negative amounts


@dataclass(frozen=True)
class Window:
    """A user's balance now and the daily sums of their entries since the first day."""

    balance_milli: int
    totals: list[DayTotal]


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


def daily_totals(ledger: Ledger, user: str, starts: Sequence[datetime]) -> Window:
    """The balance and per-day sums of the entries posted since ``starts[0]``.

    ``starts`` are the instants each day begins. The database groups the rows
    (a few hundred come back, not 10,000 entries), and on SQLite the balance is
    read in the same snapshot, so the chart's line ends exactly at the balance
    (PostgreSQL's READ COMMITTED gives each statement its own snapshot anyway)."""
    q = _totals_query(tuple(starts))
    with ledger.reader.connect() as conn:  # one read transaction (never the writer's lock)
        balance = conn.execute(
            sa.select(accounts.c.balance_milli).where(accounts.c.name == user)
        ).scalar_one_or_none()
        if balance is None:
            raise UnknownAccount(user)
        totals = [DayTotal(int(r[0]), int(r[1]), r[2], r[3], int(r[4] or 0), int(r[5] or 0))
                  for r in conn.execute(q, {"user": user})]
    return Window(int(balance), totals)


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
    with ledger.reader.connect() as conn:
        rows = [AccountRow(r[0], int(r[1]), _aware_page(r[2])) for r in conn.execute(q)]  # type: ignore[arg-type]
        total = int(conn.execute(count).scalar_one())
    return rows, total


def gpu_use_of(ledger: Ledger, user: str, first: date, last: date) -> dict[date, GpuUse]:
    """One user's GPU time per day from ``first`` to ``last`` (local days; all teams summed)."""
    q = (sa.select(gpu_use.c.day, sa.func.sum(gpu_use.c.held_milli), sa.func.sum(gpu_use.c.busy_milli),
                   sa.func.sum(gpu_use.c.unknown_milli))
         .where(gpu_use.c.user == user, gpu_use.c.day >= first, gpu_use.c.day <= last)
         .group_by(gpu_use.c.day))
    with ledger.reader.connect() as conn:
        return {r[0]: GpuUse(r[0], user, "", int(r[1]), int(r[2]), int(r[3])) for r in conn.execute(q)}


def idle_gpu_time(ledger: Ledger, by: str, since: date) -> list[tuple[str, int, int]]:
    """Idle GPU time since ``since`` (a local day) per user or per team (``by``): ``(name,
    idle, held)`` in thousandths of GPU-seconds, the most idle first (ties: by name)."""
    column = {"user": gpu_use.c.user, "team": gpu_use.c.team}[by]
    idle = sa.func.sum(gpu_use.c.held_milli - gpu_use.c.busy_milli - gpu_use.c.unknown_milli)
    q = (sa.select(column, idle, sa.func.sum(gpu_use.c.held_milli)).where(gpu_use.c.day >= since)
         .group_by(column).order_by(idle.desc(), column))
    with ledger.reader.connect() as conn:
        return [(r[0], int(r[1]), int(r[2])) for r in conn.execute(q)]
