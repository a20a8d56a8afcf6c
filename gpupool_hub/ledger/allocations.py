"""GPU allocations held by servers (``gpupool_allocations``): the service's pool is rebuilt
from the active ones at start-up, the embedded usage source charges from them, and the wait
estimates learn from the released ones. Reached as ``ledger.allocations``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..money.units import from_milli, to_milli
from .database import Db, aware, chunks, db_time
from .records import AllocationRecord
from .schema import allocations

# Statements of every spawn, built once with bound parameters: building one (SQLAlchemy's
# coercion of each clause) cost about as much as running it, 0.15 ms a statement here.
_HELD = (sa.select(allocations).where(allocations.c.released_at.is_(None))
         .order_by(allocations.c.created_at))
_HELD_BY = _HELD.where(allocations.c.user == sa.bindparam("user"))


def allocation_of(row: sa.Row) -> AllocationRecord:  # type: ignore[type-arg]
    m = row._mapping
    return AllocationRecord(
        id=m["id"], user=m["user"], server=m["server"], node=m["node"], gpus=tuple(m["gpus"]),
        request=dict(m["request"]), price_per_hour=from_milli(m["price_per_hour_milli"]),
        borrowed=bool(m["borrowed"]), created_at=aware(m["created_at"]),  # type: ignore[arg-type]
        released_at=aware(m["released_at"]), release_reason=m["release_reason"],
        charged_from=aware(m["charged_from"]), stop_asked_at=aware(m["stop_asked_at"]),
    )


class Allocations:
    """Servers' holds on GPUs: recorded at placement, released once, read whole or, for what
    is asked often or of a large pool, in light reads (the wait queue's order at every
    dispatch, the admin pool map, the owners of an hour's Slurm jobs)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    # ---- writes

    def add(self, record: AllocationRecord) -> None:
        with self.db.write() as conn:
            conn.execute(allocations.insert().values(
                id=record.id, user=record.user, server=record.server, node=record.node,
                gpus=list(record.gpus), request=record.request,
                price_per_hour_milli=to_milli(record.price_per_hour), borrowed=record.borrowed,
                created_at=db_time(record.created_at), released_at=None,
                charged_from=None if record.charged_from is None else db_time(record.charged_from),
            ))

    def release(self, alloc_id: str, *, at: datetime, reason: str) -> AllocationRecord | None:
        """Mark an allocation released (once: a second release keeps the first time and reason)."""
        with self.db.write() as conn:
            conn.execute(
                allocations.update()
                .where(allocations.c.id == alloc_id, allocations.c.released_at.is_(None))
                .values(released_at=db_time(at), release_reason=reason)
            )
            row = conn.execute(sa.select(allocations).where(allocations.c.id == alloc_id)).first()
        return None if row is None else allocation_of(row)

    def set_borrowed(self, alloc_id: str, borrowed: bool) -> None:
        """Re-classify a held allocation (fair share, after the quotas changed)."""
        with self.db.write() as conn:
            conn.execute(allocations.update().where(allocations.c.id == alloc_id).values(borrowed=borrowed))

    def set_gpus(self, alloc_id: str, gpus: Iterable[dict]) -> None:  # type: ignore[type-arg]
        """The devices a held allocation really got (a batch scheduler bound others than the pool chose)."""
        self.set_gpus_of({alloc_id: gpus})

    def set_gpus_of(self, moved: Mapping[str, Iterable[dict]]) -> None:  # type: ignore[type-arg]
        """The devices of several held allocations at once, in one transaction (a swap: both or neither)."""
        with self.db.write() as conn:
            for alloc_id, gpus in moved.items():
                conn.execute(allocations.update()
                             .where(allocations.c.id == alloc_id, allocations.c.released_at.is_(None))
                             .values(gpus=list(gpus)))

    def start_charge(self, alloc_id: str, at: datetime) -> bool:
        """The server's work started at ``at``: its charge starts then. Only the first time (a later,
        repeated report changes nothing); False when it had started already, or is released."""
        with self.db.write() as conn:
            done = conn.execute(allocations.update()
                                .where(allocations.c.id == alloc_id, allocations.c.charged_from.is_(None),
                                       allocations.c.released_at.is_(None))
                                .values(charged_from=db_time(at)))
        return bool(done.rowcount)

    def ask_stop(self, alloc_id: str, at: datetime) -> bool:
        """The hub asked the engine to stop the server at ``at`` and waits for it to confirm (renewed
        while it waits); False when the allocation is not held."""
        with self.db.write() as conn:
            done = conn.execute(allocations.update()
                                .where(allocations.c.id == alloc_id, allocations.c.released_at.is_(None))
                                .values(stop_asked_at=db_time(at)))
        return bool(done.rowcount)

    # ---- reads

    def get(self, alloc_id: str) -> AllocationRecord | None:
        """One allocation, held or released; None if the ledger has none of that id."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(allocations).where(allocations.c.id == alloc_id)).first()
        return None if row is None else allocation_of(row)

    def active(self, user: str | None = None) -> list[AllocationRecord]:
        """Held allocations (of ``user``), oldest first."""
        with self.db.read() as conn:
            rows = conn.execute(_HELD) if user is None else conn.execute(_HELD_BY, {"user": user})
            return [allocation_of(r) for r in rows]

    def overlapping(self, start: datetime, end: datetime) -> list[AllocationRecord]:
        """Allocations held at any moment of [start, end): what the embedded usage source charges."""
        q = sa.select(allocations).where(
            allocations.c.created_at < db_time(end),
            sa.or_(allocations.c.released_at.is_(None), allocations.c.released_at > db_time(start)),
        )
        with self.db.read() as conn:
            return [allocation_of(r) for r in conn.execute(q)]

    def session_lengths(self, since: datetime) -> list[tuple[dict[str, Any], str, float]]:
        """(request, user, seconds held) of each allocation released since ``since``: the history
        the wait estimates learn from."""
        q = sa.select(allocations.c.request, allocations.c.user, allocations.c.created_at,
                      allocations.c.released_at).where(allocations.c.released_at >= db_time(since))
        with self.db.read() as conn:
            return [(dict(r.request), r.user, (r.released_at - r.created_at).total_seconds())
                    for r in conn.execute(q)]

    # ---- light reads

    def active_on(self, *, nodes: Iterable[str] | None = None, newest: int | None = None) -> list[AllocationRecord]:
        """Held allocations, newest first: those on ``nodes``, or the ``newest`` few. The admin
        pool map lists a page of them; parsing all 5,000 of a large pool costs it 100 ms."""
        q = (sa.select(allocations).where(allocations.c.released_at.is_(None))
             .order_by(allocations.c.created_at.desc(), allocations.c.id))
        if nodes is not None:
            q = q.where(allocations.c.node.in_(sorted(set(nodes))))
        if newest is not None:
            q = q.limit(newest)
        with self.db.read() as conn:
            return [allocation_of(r) for r in conn.execute(q)]

    def unsettled(self) -> list[AllocationRecord]:
        """Held allocations not simply running: the server's work has not started (a batch job
        pending, not charged), or its stop is not confirmed (held and charged): the pool map lists
        them all, however old; a few in a pool of thousands."""
        q = (sa.select(allocations).where(allocations.c.released_at.is_(None),
                                          sa.or_(allocations.c.charged_from.is_(None),
                                                 allocations.c.stop_asked_at.is_not(None)))
             .order_by(allocations.c.created_at))
        with self.db.read() as conn:
            return [allocation_of(r) for r in conn.execute(q)]

    def active_holders(self) -> dict[str, tuple[str, str, bool]]:
        """Each held allocation's (user, server, borrowed), by id: who holds what on the pool
        map, without parsing every allocation's GPUs and request."""
        q = (sa.select(allocations.c.id, allocations.c.user, allocations.c.server, allocations.c.borrowed)
             .where(allocations.c.released_at.is_(None)))
        with self.db.read() as conn:
            return {i: (user, server, bool(borrowed)) for i, user, server, borrowed in conn.execute(q)}

    def held_per_user(self) -> dict[str, int]:
        """How many allocations each user holds now: the wait queue's fair order counts them at
        every dispatch, so one grouped count (from the active index), not every record parsed."""
        q = (sa.select(allocations.c.user, sa.func.count()).where(allocations.c.released_at.is_(None))
             .group_by(allocations.c.user))
        with self.db.read() as conn:
            return {user: count for user, count in conn.execute(q)}

    def owners(self, alloc_ids: Iterable[str]) -> dict[str, str]:
        """The user of each of ``alloc_ids`` the ledger has, held or released (the others are left
        out), in one query per 500 ids: charging an hour of 5,000 Slurm jobs one :meth:`get`
        read at a time took 9 s on PostgreSQL."""
        out: dict[str, str] = {}
        with self.db.read() as conn:
            for chunk in chunks(sorted(set(alloc_ids))):
                q = sa.select(allocations.c.id, allocations.c.user).where(allocations.c.id.in_(list(chunk)))
                out.update({alloc_id: user for alloc_id, user in conn.execute(q)})
        return out
