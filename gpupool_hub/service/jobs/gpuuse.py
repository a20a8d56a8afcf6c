"""The gpu-use job: what each user's GPUs did while held, kept per day for people to see.

Once per closed interval (aligned to ``interval`` seconds) it samples each held GPU or
share by the server's own figure (``jobs/idle.py: measure_own``: on a shared GPU its own
processes', never the GPU's), and adds held, busy and unknown GPU-seconds per local day,
user and team to the ledger (``ledger.gpu_use.record``) with the interval marked done in
the same transaction, so a rerun or a second service adds nothing twice. An interval the
service missed (it was down) is not made up: its time is simply not in the record.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta, timezone
from typing import Any

from ...ledger import AllocationRecord, GpuUse
from ...usage.utilization import UtilizationSource
from ..core.gpuuse import GpuUseLog
from ..core.ledger_reads import Records
from .idle import measure_own

log = logging.getLogger("gpupool.gpuuse")

#: seconds per recorded interval
GPU_USE_INTERVAL = 60.0


def use_rows(records: list[AllocationRecord], own: dict[tuple[str, str], float | None], seconds: float,
             day: date, team_of: Callable[[AllocationRecord], str]) -> list[GpuUse]:
    """Each user's held, busy and unknown GPU time over ``seconds``, in thousandths of
    GPU-seconds. A share is busy by its server's own use of the GPU, at most the share
    (0.45 of a GPU on a 0.5 share is 90 % busy); unknown where that figure is. Pure."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in records:
        for g in r.gpus:
            share = int(g["milli"])
            held = round(share * seconds)
            row = sums[(r.user, team_of(r))]
            row[0] += held
            used = own.get((r.id, g["uuid"]))
            if used is None:
                row[2] += held
            else:
                row[1] += round(min(max(used, 0.0) * 1000, share) * seconds)
    return [GpuUse(day, user, team, *v) for (user, team), v in sorted(sums.items())]


class GpuUseJob:
    """Built from the units it reads and writes (kueue-style explicit dependencies)."""

    def __init__(self, source: UtilizationSource, *, records: Records, log: GpuUseLog, settings: Any,
                 interval: float = GPU_USE_INTERVAL,
                 on_recorded: Callable[[Sequence[GpuUse]], None] = lambda rows: None) -> None:
        self.source, self.records, self.log, self.settings = source, records, log, settings
        self.interval = interval
        self.on_recorded = on_recorded  # the service's /metrics counts what was written
        self.teams = settings.team_table()

    def team_of(self, record: AllocationRecord) -> str:
        """The team the server counts against ("" without teams; older servers: the default)."""
        if not self.teams.enabled:
            return ""
        return str(record.request.get("team") or self.teams.default_team)

    async def __call__(self, now: datetime | None = None) -> bool:
        """Record the interval that closed last; False when it was recorded already."""
        now = now or datetime.now(timezone.utc)
        step = int(self.interval)
        end = datetime.fromtimestamp(int(now.timestamp()) // step * step, timezone.utc)
        start = end - timedelta(seconds=step)
        if await self.log.recorded.off_loop(start):
            return False
        records = [r for r in await self.records.active_allocations.off_loop() if r.gpus]
        try:
            readings = await measure_own(self.source, records, self.interval) if records else {}
        except Exception as e:  # recorded as held, of unknown use: never a guess
            log.warning("GPU utilization unavailable for the GPU-use record (held time counts as unknown): %s", e)
            readings = {}
        own = {key: r.utilization for key, r in readings.items()}
        day = start.astimezone(self.settings.tz).date()
        rows = use_rows(records, own, step, day, self.team_of)
        recorded = await self.log.record.off_loop(rows, start, end)
        if recorded:
            self.on_recorded(rows)
        return recorded
