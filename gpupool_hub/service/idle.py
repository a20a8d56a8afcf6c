"""Idle GPUs taken back: the rule (pure ``decide_idle``), where utilization comes
from, and the warnings users see.

A server is *idle* when every GPU it holds stayed under ``c.GPUPool.idle_threshold``
for ``idle_after`` seconds. An idle server whose GPUs someone else waits for
(the wait queue) gets a warning with a deadline (``GET me``'s ``cull_warning``,
shown by the lab widget); after ``idle_grace`` it is stopped through the hub
API (files untouched) and audited as ``idle_reclaim``. With ``max_idle`` set, a
server idle that long is stopped even when nobody waits. Servers younger than
``min_runtime`` are never touched.

Utilization comes from Prometheus (the node agent's
``gpupool_agent_gpu_utilization_ratio`` by ``gpu_uuid``, or DCGM's
``DCGM_FI_DEV_GPU_UTIL`` with another query), else from the node agents'
reports to ``PUT nodes/{node}/utilization`` (:class:`ReportedUtilization`).

What users and admins see is measured by the same job, once per run, and never
per request (every lab tab polls ``GET me``): each held GPU's latest
utilization and memory and since when it has been idle (``readings``), each
server's idleness (the pure ``server_idleness``: idle since, from when it may be
reclaimed), published whole in :class:`IdleWarnings`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient

from ..reasons import AuditAction
from ..timefmt import iso
from .enforcement import CullWarning

log = logging.getLogger("gpupool.idle")

#: a GPU without a report for this long is unknown (its agent is down), never idle
REPORT_STALE_SECONDS = 300.0


@dataclass(frozen=True)
class GpuReading:
    """What is known of one GPU now: shown to its holder (``GET me``) and to admins
    (``GET pool``). ``None`` where the source cannot say."""

    utilization: float | None          # the latest value, 0-1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    #: start of the current run under the threshold, as far back as the source looked
    #: (``window``); None while busy or unknown
    idle_since: datetime | None


class UtilizationSource(Protocol):
    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        """The highest utilization (0-1) of each GPU over the last ``window`` seconds;
        GPUs without data for the whole window are left out (unknown, never idle)."""
        ...

    async def readings(self, uuids: Iterable[str], window: float) -> dict[str, GpuReading]:
        """The latest reading of each GPU, its idle run looked for over ``window`` seconds;
        GPUs without data are left out."""
        ...


def _subquery_step(window: float) -> int:
    """Subquery resolution: about 240 points over the window, never coarser than a
    usual scrape interval (15 s) so a short busy spell is not stepped over."""
    return max(1, min(15, int(window // 240) or 1))


class PrometheusUtilization:
    """Utilization per GPU UUID from Prometheus: ``max_over_time`` of ``metric`` for the
    rule; for what users see, the latest value, the last sample at or over the
    threshold (the idle run's start) and memory from ``memory_used_query`` /
    ``memory_total_query`` (PromQL in bytes, by the same UUID label; empty: unknown)."""

    def __init__(self, url: str, metric: str = "gpupool_agent_gpu_utilization_ratio", uuid_label: str = "gpu_uuid",
                 scale: float = 1.0, token: str = "", *, threshold: float = 0.05,
                 memory_used_query: str = "gpupool_agent_gpu_memory_used_bytes",
                 memory_total_query: str = "gpupool_agent_gpu_memory_total_bytes") -> None:
        self.url, self.metric, self.uuid_label, self.scale, self.token = url, metric, uuid_label, scale, token
        self.threshold = threshold
        self.memory_used_query, self.memory_total_query = memory_used_query, memory_total_query

    async def query(self, promql: str, at: float | None = None) -> dict[str, float]:
        """An instant query: value per UUID label (series without the label are left out)."""
        args = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        url = f"{self.url.rstrip('/')}/api/v1/query?" + urlencode(args)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await AsyncHTTPClient().fetch(url, headers=headers, request_timeout=10)
        body = json.loads(resp.body)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
        out = {}
        for item in body["data"]["result"]:
            uuid = item["metric"].get(self.uuid_label)
            if uuid is not None:
                out[uuid] = float(item["value"][1])
        return out

    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        wanted = set(uuids)
        if not wanted:
            return {}
        seconds = max(int(window), 1)
        # data for the whole window: the series existed at its start too
        query = (f"max by ({self.uuid_label}) (max_over_time({self.metric}[{seconds}s])) "
                 f"and on ({self.uuid_label}) max by ({self.uuid_label}) ({self.metric} offset {seconds}s)")
        return {u: v / self.scale for u, v in (await self.query(query)).items() if u in wanted}

    async def readings(self, uuids: Iterable[str], window: float) -> dict[str, GpuReading]:
        wanted = set(uuids)
        if not wanted:
            return {}
        at = datetime.now(timezone.utc).timestamp()
        seconds, step, by = max(int(window), 1), _subquery_step(window), self.uuid_label
        busy_at = self.threshold * self.scale
        queries = [
            f"max by ({by}) ({self.metric})",
            f"max by ({by}) (max_over_time(timestamp({self.metric} >= {busy_at:g})[{seconds}s:{step}s]))",
            f"min by ({by}) (min_over_time(timestamp({self.metric})[{seconds}s:{step}s]))",
        ]
        now, last_busy, first = await asyncio.gather(*(self.query(q, at) for q in queries))
        memory: list[dict[str, float]] = [{}, {}]
        for i, q in enumerate((self.memory_used_query, self.memory_total_query)):
            if q:
                try:
                    memory[i] = await self.query(q, at)
                except Exception as e:  # memory is shown, never decided on: utilization still counts
                    log.warning("GPU memory unavailable from Prometheus (%s): %s", q, e)
        out = {}
        for uuid in wanted & (now.keys() | memory[0].keys() | memory[1].keys()):
            value = now.get(uuid)
            util = None if value is None else value / self.scale
            since = None
            if util is not None and util < self.threshold:
                if uuid in last_busy:
                    since = last_busy[uuid]
                elif uuid in first:
                    since = max(first[uuid], at - seconds)
            used, total = memory[0].get(uuid), memory[1].get(uuid)
            out[uuid] = GpuReading(
                util, None if used is None else int(used), None if total is None else int(total),
                None if since is None else datetime.fromtimestamp(since, timezone.utc))
        return out


class ReportedUtilization:
    """Utilization from the node agents' reports, kept in memory: per GPU, since when
    it has been reported and when it was last busy (and memory, when reported)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._gpus: dict[str, tuple[datetime, datetime | None, datetime, float]] = {}  # first, busy, last, value
        self._memory: dict[str, tuple[int, int]] = {}  # used, total bytes
        self._lock = threading.Lock()

    def report(self, values: Mapping[str, float], at: datetime,
               memory: Mapping[str, tuple[int, int]] | None = None) -> None:
        with self._lock:
            for uuid, value in values.items():
                first, busy, last, _ = self._gpus.get(uuid, (at, None, at, 0.0))
                if (at - last).total_seconds() > REPORT_STALE_SECONDS:
                    first, busy = at, None  # a gap in the reports: start over
                if value >= self.threshold:
                    busy = at
                self._gpus[uuid] = (first, busy, at, value)
            self._memory.update(memory or {})

    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        now = datetime.now(timezone.utc)
        start = now - timedelta(seconds=window)
        out = {}
        with self._lock:
            for uuid in uuids:
                entry = self._gpus.get(uuid)
                if entry is None:
                    continue
                first, busy, last, value = entry
                if first > start or (now - last).total_seconds() > REPORT_STALE_SECONDS:
                    continue  # not known for the whole window
                out[uuid] = 1.0 if busy is not None and busy >= start else value
        return out

    async def readings(self, uuids: Iterable[str], window: float) -> dict[str, GpuReading]:
        now = datetime.now(timezone.utc)
        out = {}
        with self._lock:
            for uuid in uuids:
                entry = self._gpus.get(uuid)
                if entry is None or (now - entry[2]).total_seconds() > REPORT_STALE_SECONDS:
                    continue  # never reported, or its agent went quiet: unknown
                first, busy, _, value = entry
                since = None if value >= self.threshold else max(busy or first, now - timedelta(seconds=window))
                used, total = self._memory.get(uuid, (None, None))
                out[uuid] = GpuReading(value, used, total, since)
        return out


@dataclass(frozen=True)
class IdleServer:
    """What the rule needs to know about one GPU server."""

    user: str
    server: str
    allocation: str
    started: datetime
    idle: bool            # every GPU under the threshold for idle_after
    idle_long: bool       # ... and for max_idle (when set)
    wanted: bool          # another user waits for GPUs like these


@dataclass(frozen=True)
class IdleDecision:
    user: str
    server: str
    allocation: str
    action: AuditAction  # IDLE_WARN, IDLE_RECLAIM or CLEAR_WARNING
    reason: str
    deadline: datetime | None = None


def _span(seconds: float) -> str:
    return f"{seconds:g} seconds" if seconds < 120 else f"{seconds / 60:g} minutes"


def decide_idle(servers: Iterable[IdleServer], warnings: Mapping[tuple[str, str], CullWarning], now: datetime, *,
                grace: float, min_runtime: float, idle_after: float, max_idle: float) -> list[IdleDecision]:
    """Every idle action due now. Pure."""
    out = []
    for s in servers:
        key = (s.user, s.server)
        warning = warnings.get(key)
        young = (now - s.started).total_seconds() < min_runtime
        why = None
        if s.idle and s.wanted and not young:
            why = (f"its GPUs have been idle for over {_span(idle_after)} and another user is waiting "
                   "for them")
        elif s.idle_long and not young:
            why = f"its GPUs have been idle for over {_span(max_idle)}"
        if why is None:
            if warning is not None:
                out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.CLEAR_WARNING,
                                        "the server is no longer idle, or nobody waits for its GPUs any more"))
            continue
        if warning is None:
            out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.IDLE_WARN,
                                    f"server {s.server or 'default'} will be stopped: {why} (files are kept)",
                                    now + timedelta(seconds=grace)))
        elif now >= warning.deadline:
            out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.IDLE_RECLAIM,
                                    f"stopped server {s.server or 'default'}: {why}"))
    return out


@dataclass(frozen=True)
class ServerIdleness:
    idle_since: datetime          # every GPU of the server under the threshold since
    reclaimable_at: datetime      # from then on it may be reclaimed if someone waits
    max_idle_at: datetime | None  # ... and stopped anyway (max_idle), when set


def server_idleness(started: datetime, readings: Iterable[GpuReading | None], *, idle_after: float,
                    min_runtime: float, max_idle: float) -> ServerIdleness | None:
    """How idle a server is, from its GPUs' readings (None where unknown). Pure.

    It is idle since the latest of its GPUs' idle runs began (shown no earlier than
    its start), and counts as idle for the rule once that run lasted ``idle_after``,
    never before ``min_runtime`` (the same times ``decide_idle`` acts on). None when
    a GPU is busy or unknown."""
    runs = [r.idle_since if r is not None else None for r in readings]
    if not runs or any(r is None for r in runs):
        return None
    since: datetime = max(runs)  # type: ignore[type-var]
    protected = started + timedelta(seconds=min_runtime)
    return ServerIdleness(
        idle_since=max(since, started),
        reclaimable_at=max(since + timedelta(seconds=idle_after), protected),
        max_idle_at=max(since + timedelta(seconds=max_idle), protected) if max_idle else None)


class IdleWarnings:
    """What users see of idleness: the idle warnings per (user, server), and the last
    readings of the held GPUs with each server's idleness; written by the idle job only
    (the readings are replaced whole, so a view never mixes two runs)."""

    def __init__(self) -> None:
        self.warnings: dict[tuple[str, str], CullWarning] = {}
        self.dry: dict[tuple[str, str], CullWarning] = {}
        self.allocations: dict[tuple[str, str], str] = {}
        self.measured: tuple[datetime | None, dict[str, GpuReading], dict[str, ServerIdleness]] = (None, {}, {})

    def publish(self, at: datetime | None, readings: dict[str, GpuReading],
                servers: dict[str, ServerIdleness]) -> None:
        """The idle job's new readings (per GPU UUID) and idleness (per allocation id)."""
        self.measured = (at, readings, servers)

    def idle_since(self) -> dict[str, datetime]:
        """Allocation id -> since when the server is idle (the admins' pool view)."""
        return {a: s.idle_since for a, s in self.measured[2].items()}

    def activity(self, user: str, allocations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``GET me``'s ``gpu_servers``: the user's held GPUs as measured, and each
        server's idleness, from the allocations of the user's (cached) view."""
        at, readings, servers = self.measured
        out = []
        for a in allocations:
            gpus = []
            for g in a["gpus"]:
                r = readings.get(g["uuid"])
                gpus.append({"uuid": g["uuid"], "index": g["index"], "model": g["model"],
                             "utilization": None if r is None or r.utilization is None else round(r.utilization, 4),
                             "memory_used_bytes": r.memory_used_bytes if r else None,
                             "memory_total_bytes": r.memory_total_bytes if r else None})
            idle = servers.get(a["id"])
            warning = self.warnings.get((user, a["server"]))
            out.append({"allocation": a["id"], "server": a["server"], "node": a["node"], "gpus": gpus,
                        "measured_at": iso(at) if readings else None,
                        "idle_since": iso(idle.idle_since) if idle else None,
                        "reclaimable_at": iso(idle.reclaimable_at) if idle else None,
                        "max_idle_at": iso(idle.max_idle_at) if idle and idle.max_idle_at else None,
                        "reclaim_deadline": iso(warning.deadline) if warning else None})
        return out

    def for_user(self, user: str) -> CullWarning | None:
        mine = [w for (u, _), w in list(self.warnings.items()) if u == user]
        return min(mine, key=lambda w: w.deadline) if mine else None

    def deadlines(self) -> dict[str, datetime]:
        """Allocation id -> idle stop deadline (wait estimates use them)."""
        return {self.allocations[k]: w.deadline for k, w in list(self.warnings.items()) if k in self.allocations}
