"""The wait queue's records: the servers waiting for GPUs (``gpupool_queue``, so that a
restart of the service loses nobody's place) and the start estimate each was shown, with
its real start (``gpupool_estimates``: the estimates' published accuracy, and what the next
ones are calibrated on). Reached as ``ledger.queue``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .database import Db, aware, db_time, insert_new
from .schema import estimates, queue


class Queue:
    """Waiting servers and their shown estimates."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def add(self, entry: Mapping[str, Any], shown: Sequence[Any] | None = None) -> None:
        """Store a waiting server (keys as the ``gpupool_queue`` columns); with ``shown`` (the
        arguments of :meth:`estimate_shown`), the estimate it was shown, in the same transaction."""
        with self.db.write() as conn:
            conn.execute(queue.insert(), {**entry, "since": db_time(entry["since"])})
            if shown is not None:
                self._estimate_shown(conn, *shown)

    def remove(self, entry_id: str) -> None:
        with self.db.write() as conn:
            conn.execute(queue.delete().where(queue.c.id == entry_id))

    def rows(self) -> list[dict[str, Any]]:
        """Every waiting server, oldest first."""
        with self.db.read() as conn:
            rows = conn.execute(sa.select(queue).order_by(queue.c.since, queue.c.id))
            return [{**r._mapping, "since": aware(r.since)} for r in rows]

    def estimate_shown(self, entry_id: str, user: str, at: datetime, bounds: Sequence[int | None],
                       basis: str, model_s: int | None = None) -> None:
        """Record the estimate shown to a waiting entry (``bounds``: low, mid, high seconds
        after ``at``; ``model_s``: the model's own estimate). Idempotent: the first one shown stays."""
        with self.db.write() as conn:
            self._estimate_shown(conn, entry_id, user, at, bounds, basis, model_s)

    @staticmethod
    def _estimate_shown(conn: Connection, entry_id: str, user: str, at: datetime, bounds: Sequence[int | None],
                        basis: str, model_s: int | None = None) -> None:
        low, mid, high = bounds  # the first one shown stays: a second is ignored, in one round trip
        conn.execute(insert_new(conn, estimates), dict(id=entry_id, user=user, shown_at=db_time(at), low_s=low,
                                                       mid_s=mid, high_s=high, basis=basis, model_s=model_s))

    def estimate_started(self, entry_id: str, at: datetime) -> None:
        """The entry really started (its GPUs were claimed); once: a second call keeps the first time."""
        with self.db.write() as conn:
            conn.execute(estimates.update().where(estimates.c.id == entry_id, estimates.c.started_at.is_(None))
                         .values(started_at=db_time(at)))

    def started_estimates(self, since: datetime) -> list[tuple[int | None, int | None, int | None, float]]:
        """(low, mid, high, real wait) in seconds of each shown estimate whose entry started since ``since``."""
        q = sa.select(estimates.c.low_s, estimates.c.mid_s, estimates.c.high_s, estimates.c.shown_at,
                      estimates.c.started_at).where(estimates.c.started_at >= db_time(since))
        with self.db.read() as conn:
            return [(r.low_s, r.mid_s, r.high_s, (r.started_at - r.shown_at).total_seconds()) for r in conn.execute(q)]

    def shown_model_estimates(self, entry_ids: list[str]) -> list[tuple[int, datetime]]:
        """(the model's estimate in seconds, when shown) of those entries that have one (the
        waiters still waiting: their misses so far count in the calibration)."""
        if not entry_ids:
            return []
        q = sa.select(estimates.c.model_s, estimates.c.shown_at).where(
            estimates.c.id.in_(entry_ids), estimates.c.model_s.is_not(None), estimates.c.started_at.is_(None))
        with self.db.read() as conn:
            return [(r.model_s, aware(r.shown_at)) for r in conn.execute(q)]

    def calibration_pairs(self, since: datetime, limit: int) -> list[tuple[int, float]]:
        """(the model's estimate, the real wait) in seconds of the ``limit`` latest starts since
        ``since`` that had one, oldest first: what the next ranges are calibrated on."""
        q = (sa.select(estimates.c.model_s, estimates.c.shown_at, estimates.c.started_at)
             .where(estimates.c.started_at >= db_time(since), estimates.c.model_s.is_not(None))
             .order_by(estimates.c.started_at.desc()).limit(limit))
        with self.db.read() as conn:
            rows = conn.execute(q).all()
        return [(r.model_s, (r.started_at - r.shown_at).total_seconds()) for r in reversed(rows)]
