"""The idle reclaim job: warn idle GPU servers that others wait for, stop them
after the grace (rules in ``gpupool_hub/takeback/idle.py``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from ...config import GPUPool
from ...takeback.cull import CullWarning
from ...takeback.idle import GpuReading, IdleDecision, IdleServer, decide_idle, server_idleness
from ...ledger import AllocationRecord, AuditEvent
from ...reasons import AuditAction
from ...usage.utilization import UserGpu, UtilizationSource
from ..core.admission import Admission
from ..core.enforcement import Enforcement
from ..core.idle import IdleWarnings
from ..core.takeback_notices import Notices
from ..core.queue import WaitQueue
from ..core.ledger_reads import Records
from ..core.views import ViewCache
from ..common.hubapi import HubClient, HubError

log = logging.getLogger("gpupool.idle")


class IdleJob:
    """Built from the units it reads and drives (kueue-style explicit dependencies)."""

    def __init__(self, hub: HubClient, source: UtilizationSource, *, settings: GPUPool, records: Records,
                 idle: IdleWarnings, queue: WaitQueue, admission: Admission,
                 enforcement: Enforcement, notices: Notices, cache: ViewCache) -> None:
        self.hub = hub
        self.settings, self.records, self.idle, self.queue = settings, records, idle, queue
        self.admission, self.enforcement, self.notices, self.cache = admission, enforcement, notices, cache
        self.source = source

    async def __call__(self) -> None:
        s = self.settings
        now = datetime.now(timezone.utc)
        records = await self.records.active_allocations.off_loop()
        uuids, shared, pairs = held_gpus(records)
        window = max(s.idle_after, s.max_idle)
        try:
            own = await measure_own(self.source, records, window)
            peak = await self.source.peak(uuids, s.idle_after)
            peak_long = await self.source.peak(uuids, s.max_idle) if s.max_idle else {}
            if pairs:
                own_peak = await self.source.user_peak(pairs, s.idle_after)
                own_long = await self.source.user_peak(pairs, s.max_idle) if s.max_idle else {}
            else:
                own_peak, own_long = {}, {}
        except Exception as e:  # no data, no idleness: never stop a server on a guess
            log.warning("GPU utilization unavailable for idle reclaim (nothing is reclaimed): %s", e)
            self.idle.publish(None, {}, {})
            return
        self.idle.publish(now, own, {
            r.id: idle for r in records if r.gpus and (idle := server_idleness(
                r.created_at, [own.get((r.id, g["uuid"])) for g in r.gpus], idle_after=s.idle_after,
                min_runtime=s.min_runtime, max_idle=s.max_idle)) is not None})
        servers = []
        demands = await self.queue.demand.off_loop(  # one pass over the waiters for every holder
            {(r.user, frozenset(g["model"] for g in r.gpus)) for r in records if r.gpus})
        for r in records:
            ids = [g["uuid"] for g in r.gpus]
            if not ids:
                continue
            models = frozenset(g["model"] for g in r.gpus)
            highs = [own_peak.get((r.user, u)) if u in shared else peak.get(u) for u in ids]
            longs = [own_long.get((r.user, u)) if u in shared else peak_long.get(u) for u in ids]
            servers.append(IdleServer(
                user=r.user, server=r.server, allocation=r.id, started=r.created_at,
                idle=all(h is not None and h < s.idle_threshold for h in highs),
                idle_long=bool(s.max_idle) and all(h is not None and h < s.idle_threshold for h in longs),
                wanted=demands[(r.user, models)] is not None,
                peak=max(h for h in highs) if all(h is not None for h in highs) else None,
                shared=any(u in shared for u in ids)))
        warnings = self.idle.warnings_for(s.idle_dry_run)
        for d in decide_idle(servers, warnings, now, grace=s.idle_grace, min_runtime=s.min_runtime,
                             idle_after=s.idle_after, max_idle=s.max_idle):
            try:
                await self.carry_out(d, warnings)
            except Exception:
                log.exception("Idle reclaim: could not %s for %s/%s", d.action, d.user, d.server)

    async def carry_out(self, d: IdleDecision, warnings: dict[tuple[str, str], CullWarning]) -> None:
        dry = self.settings.idle_dry_run
        now = datetime.now(timezone.utc)
        detail: dict[str, Any] = {"allocation": d.allocation}
        if dry:
            log.warning("[dry run] would %s for %s/%s: %s", d.action, d.user, d.server or "-", d.reason)
        if d.action == AuditAction.CLEAR_WARNING:
            self.idle.clear(d.user, d.server, dry_run=dry)
            self.cache.forget(d.user)
            return
        if d.action == AuditAction.IDLE_WARN:
            self.idle.warn(d.user, d.server, CullWarning("server", d.reason, d.deadline),  # type: ignore[arg-type]
                           d.allocation, dry_run=dry)
            self.cache.forget(d.user)
            detail["deadline"] = d.deadline.isoformat() if d.deadline else None
            log.warning("Idle warning for %s/%s until %s: %s", d.user, d.server or "-", d.deadline, d.reason)
        elif d.action == AuditAction.IDLE_RECLAIM and not dry:
            try:
                await self.hub.stop_server(d.user, d.server)
            except HubError as e:
                log.error("Could not stop idle %s/%s: %s", d.user, d.server or "-", e)
                await self.notices.record.off_loop(AuditEvent(
                    now, d.user, d.server, AuditAction.FAILED.value, f"{d.action}: {e}", dry))
                return
            self.idle.clear(d.user, d.server, dry_run=dry)
            self.cache.forget(d.user)
            # the spawner releases on stop; release here too (a no-op then) so a waiter starts at once
            await self.admission.release.off_loop(d.allocation, f"{d.action}: {d.reason}")
            self.enforcement.gpus_taken(d.user, d.server, now)
            log.warning("Stopped idle %s/%s: %s", d.user, d.server or "-", d.reason)
        elif d.action == AuditAction.IDLE_RECLAIM:
            self.idle.clear(d.user, d.server, dry_run=dry)
        await self.notices.record.off_loop(AuditEvent(now, d.user, d.server, str(d.action), d.reason, dry,
                                                      detail))


def held_gpus(records: Iterable[AllocationRecord]) -> tuple[list[str], set[str], list[UserGpu]]:
    """The GPUs the servers hold (one UUID per holding), those several servers share, and
    the (user, GPU) pairs on shared GPUs: a server there is judged by its own processes,
    never by the GPU's figure."""
    uuids = [g["uuid"] for r in records for g in r.gpus]
    shared = {u for u, holdings in Counter(uuids).items() if holdings > 1}  # one pass: 10,000 GPUs at a facility
    pairs = sorted({(r.user, g["uuid"]) for r in records for g in r.gpus if g["uuid"] in shared})
    return uuids, shared, pairs


async def measure_own(source: UtilizationSource, records: list[AllocationRecord],
                      window: float) -> dict[tuple[str, str], GpuReading]:
    """What each server's own processes do now, per (allocation id, GPU UUID), as
    :func:`own_readings` tells it; raises when the source cannot be read. The idle job and
    the cull job's pressure rule both judge servers by this."""
    uuids, shared, pairs = held_gpus(records)
    readings = await source.readings(uuids, window)
    mine = await source.user_readings(pairs, window) if pairs else {}
    return own_readings(records, shared, readings, mine)


def own_readings(records: Any, shared: set[str], readings: dict[str, GpuReading],
                 mine: dict[UserGpu, GpuReading]) -> dict[tuple[str, str], GpuReading]:
    """Per (allocation id, GPU UUID): what the server's own processes did there. The GPU's
    reading where it holds the GPU alone; on a shared GPU its user's own figure (with the
    GPU's memory), or nothing when that is unknown."""
    out = {}
    for r in records:
        for g in r.gpus:
            uuid = g["uuid"]
            if uuid not in shared:
                if uuid in readings:
                    out[(r.id, uuid)] = readings[uuid]
                continue
            own, gpu = mine.get((r.user, uuid)), readings.get(uuid)
            if own is not None:
                out[(r.id, uuid)] = GpuReading(own.utilization, gpu.memory_used_bytes if gpu else None,
                                               gpu.memory_total_bytes if gpu else None, own.idle_since)
    return out
