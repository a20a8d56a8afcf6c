"""What users' GPUs did while held (``gpupool_gpu_use``): GPU-seconds held, busy and of
unknown use per local day, user and team, added one interval at a time by the gpu-use job.
Reached as ``ledger.gpu_use``; the pages read the sums through ``ledger.reports``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from .database import Db, db_time, insert_new, utcnow
from .records import GpuUse
from .schema import gpu_use, intervals


class GpuUseDays:
    """The daily sums of what users' GPUs did."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def record(self, rows: Iterable[GpuUse], interval: tuple[str, datetime, datetime],
               *, now: datetime | None = None) -> bool:
        """Add one interval's measurements to the daily sums and mark the interval done, in
        one transaction; an interval already recorded adds nothing (False)."""
        job, start, end = interval
        with self.db.write() as conn:
            marked = conn.execute(insert_new(conn, intervals).returning(intervals.c.job), dict(
                job=job, start=db_time(start), end=db_time(end), completed_at=db_time(now or utcnow()),
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
