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
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient

from ..reasons import AuditAction
from .enforcement import CullWarning

log = logging.getLogger("gpupool.idle")

#: a GPU without a report for this long is unknown (its agent is down), never idle
REPORT_STALE_SECONDS = 300.0


class UtilizationSource(Protocol):
    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        """The highest utilization (0-1) of each GPU over the last ``window`` seconds;
        GPUs without data for the whole window are left out (unknown, never idle)."""
        ...


class PrometheusUtilization:
    """Peak utilization per GPU UUID from Prometheus: ``max_over_time`` of ``metric``."""

    def __init__(self, url: str, metric: str = "gpupool_agent_gpu_utilization_ratio", uuid_label: str = "gpu_uuid",
                 scale: float = 1.0, token: str = "") -> None:
        self.url, self.metric, self.uuid_label, self.scale, self.token = url, metric, uuid_label, scale, token

    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        wanted = set(uuids)
        if not wanted:
            return {}
        seconds = max(int(window), 1)
        # data for the whole window: the series existed at its start too
        query = (f"max by ({self.uuid_label}) (max_over_time({self.metric}[{seconds}s])) "
                 f"and on ({self.uuid_label}) max by ({self.uuid_label}) ({self.metric} offset {seconds}s)")
        url = f"{self.url.rstrip('/')}/api/v1/query?" + urlencode({"query": query})
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await AsyncHTTPClient().fetch(url, headers=headers, request_timeout=10)
        out = {}
        for item in json.loads(resp.body)["data"]["result"]:
            uuid = item["metric"].get(self.uuid_label)
            if uuid in wanted:
                out[uuid] = float(item["value"][1]) / self.scale
        return out


class ReportedUtilization:
    """Utilization from the node agents' reports, kept in memory: per GPU, since when
    it has been reported and when it was last busy."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._gpus: dict[str, tuple[datetime, datetime | None, datetime, float]] = {}  # first, busy, last, value
        self._lock = threading.Lock()

    def report(self, values: Mapping[str, float], at: datetime) -> None:
        with self._lock:
            for uuid, value in values.items():
                first, busy, last, _ = self._gpus.get(uuid, (at, None, at, 0.0))
                if (at - last).total_seconds() > REPORT_STALE_SECONDS:
                    first, busy = at, None  # a gap in the reports: start over
                if value >= self.threshold:
                    busy = at
                self._gpus[uuid] = (first, busy, at, value)

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


class IdleWarnings:
    """The idle warnings users see, per (user, server); written by the idle job only."""

    def __init__(self) -> None:
        self.warnings: dict[tuple[str, str], CullWarning] = {}
        self.dry: dict[tuple[str, str], CullWarning] = {}
        self.allocations: dict[tuple[str, str], str] = {}

    def for_user(self, user: str) -> CullWarning | None:
        mine = [w for (u, _), w in self.warnings.items() if u == user]
        return min(mine, key=lambda w: w.deadline) if mine else None

    def deadlines(self) -> dict[str, datetime]:
        """Allocation id -> idle stop deadline (wait estimates use them)."""
        return {self.allocations[k]: w.deadline for k, w in list(self.warnings.items()) if k in self.allocations}
