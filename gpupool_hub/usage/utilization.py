"""GPU utilization per GPU UUID: the one reader of it, from Prometheus or the node agents' reports.

From Prometheus (the node agent's ``gpupool_agent_gpu_utilization_ratio`` by
``gpu_uuid``, or DCGM's ``DCGM_FI_DEV_GPU_UTIL`` with another query), else from
the node agents' reports to ``PUT nodes/{node}/utilization``
(:class:`ReportedUtilization`). The idle job reads per-GPU readings; the cull
job's pressure rule reads the pool's utilization (:meth:`PrometheusUtilization.scalar`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient

from ..idle import GpuReading

log = logging.getLogger("gpupool.idle")

#: a GPU without a report for this long is unknown (its agent is down), never idle
REPORT_STALE_SECONDS = 300.0


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

    async def _instant(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result: the series with their labels and values."""
        args = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        url = f"{self.url.rstrip('/')}/api/v1/query?" + urlencode(args)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await AsyncHTTPClient().fetch(url, headers=headers, request_timeout=10)
        body = json.loads(resp.body)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
        return list(body["data"]["result"])

    async def scalar(self, promql: str) -> float:
        """The first value of an instant query, whatever its labels: the pool's utilization for
        the cull job's pressure rule. Raises when Prometheus has no such series."""
        return float((await self._instant(promql))[0]["value"][1])

    async def query(self, promql: str, at: float | None = None) -> dict[str, float]:
        """An instant query: value per UUID label (series without the label are left out)."""
        out = {}
        for item in await self._instant(promql, at):
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
