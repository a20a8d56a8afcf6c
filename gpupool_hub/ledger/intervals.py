"""Which intervals each periodic job (debit, gpu-use) has completed (``gpupool_intervals``):
an interval is marked done in the same transaction as what it wrote (the book's
``post_many``, ``ledger.gpu_use.record``), and read here to find the next one. Reached as
``ledger.intervals``."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from .database import Db, aware, db_time
from .schema import intervals


class Intervals:
    """The completed intervals of the periodic jobs."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def done(self, job: str, start: datetime) -> bool:
        """Whether ``job`` completed the interval that starts at ``start``."""
        with self.db.read() as conn:
            return conn.execute(
                sa.select(intervals.c.job).where(intervals.c.job == job, intervals.c.start == db_time(start))
            ).first() is not None

    def last(self, job: str) -> tuple[datetime, datetime] | None:
        """The most recent completed interval of ``job``, or None."""
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(intervals.c.start, intervals.c.end, intervals.c.completed_at)
                .where(intervals.c.job == job)
                .order_by(intervals.c.start.desc())
                .limit(1)
            ).first()
        return None if row is None else (aware(row[0]), aware(row[1]))  # type: ignore[return-value]
