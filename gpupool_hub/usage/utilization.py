"""GPU utilization per GPU UUID: the one reader of it, from Prometheus or the node agents' reports.

From Prometheus (the node agent's ``gpupool_agent_gpu_utilization_ratio`` by
``gpu_uuid``, or DCGM's ``DCGM_FI_DEV_GPU_UTIL`` with another query), else from
the node agents' reports to ``PUT nodes/{node}/utilization``
(:class:`ReportedUtilization`). The idle job reads per-GPU readings; the cull
job's pressure rule reads the pool's utilization (:meth:`PrometheusUtilization.scalar`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol, TypeVar
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient

from .. import strictjson
from ..takeback.idle import GpuReading

log = logging.getLogger("gpupool.idle")

#: a GPU without a report for this long is unknown (its agent is down), never idle
REPORT_STALE_SECONDS = 300.0

#: (user, GPU UUID): one user's own use of a GPU that several users share
UserGpu = tuple[str, str]
K = TypeVar("K")


class UtilizationSource(Protocol):
    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        """The highest utilization (0-1) of each GPU over the last ``window`` seconds;
        GPUs without data for the whole window are left out (unknown, never idle)."""
        ...

    async def readings(self, uuids: Iterable[str], window: float) -> dict[str, GpuReading]:
        """The latest reading of each GPU, its idle run looked for over ``window`` seconds;
        GPUs without data are left out."""
        ...

    async def user_peak(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, float]:
        """Like :meth:`peak`, for one user's own processes on a GPU that several users
        share; left out where the node's agent could not attribute that GPU's use for
        the whole window (unknown, never idle)."""
        ...

    async def user_readings(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, GpuReading]:
        """Like :meth:`readings`, for one user's own processes on a shared GPU (memory:
        the whole GPU's); left out where unknown."""
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
        body = strictjson.loads(resp.body)
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


    # ------------------------------------------------------------ per user, on shared GPUs

    user_metric = "gpupool_agent_user_gpu_utilization_ratio"
    attribution_metric = "gpupool_agent_attribution_ok"

    async def _pairs(self, promql: str, at: float | None = None) -> dict[UserGpu, float]:
        """An instant query's value per (user, GPU UUID)."""
        out = {}
        for item in await self._instant(promql, at):
            labels = item["metric"]
            if "user" in labels and "gpu_uuid" in labels:
                out[(labels["user"], labels["gpu_uuid"])] = float(item["value"][1])
        return out

    async def _by_gpu(self, promql: str, at: float | None = None) -> dict[str, float]:
        return {item["metric"]["gpu_uuid"]: float(item["value"][1]) for item in await self._instant(promql, at)
                if "gpu_uuid" in item["metric"]}

    async def user_peak(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, float]:
        wanted = set(pairs)
        if not wanted:
            return {}
        seconds, ok = max(int(window), 1), self.attribution_metric
        peaks, attributed = await asyncio.gather(
            self._pairs(f"max by (user, gpu_uuid) (max_over_time({self.user_metric}[{seconds}s]))"),
            self._by_gpu(f"min by (gpu_uuid) (min_over_time({ok}[{seconds}s])) "
                         f"and on (gpu_uuid) max by (gpu_uuid) ({ok} offset {seconds}s)"))
        # attributable all along: a user without a series had no process there (0)
        return {p: peaks.get(p, 0.0) for p in wanted if attributed.get(p[1]) == 1}

    async def user_readings(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, GpuReading]:
        wanted = set(pairs)
        if not wanted:
            return {}
        at = datetime.now(timezone.utc).timestamp()
        seconds, step, ok, metric = max(int(window), 1), _subquery_step(window), self.attribution_metric, self.user_metric
        now, attributed, last_busy, last_bad, first = await asyncio.gather(
            self._pairs(f"max by (user, gpu_uuid) ({metric})", at),
            self._by_gpu(f"min by (gpu_uuid) ({ok})", at),
            self._pairs(f"max by (user, gpu_uuid) (max_over_time(timestamp({metric} >= {self.threshold:g})"
                        f"[{seconds}s:{step}s]))", at),
            self._by_gpu(f"max by (gpu_uuid) (max_over_time(timestamp({ok} == 0)[{seconds}s:{step}s]))", at),
            self._by_gpu(f"min by (gpu_uuid) (min_over_time(timestamp({ok})[{seconds}s:{step}s]))", at))
        out = {}
        for pair in wanted:
            if attributed.get(pair[1]) != 1:
                continue  # unknown now
            util = now.get(pair, 0.0)
            since = None
            if util < self.threshold:
                since = max(last_busy.get(pair, 0.0), last_bad.get(pair[1], 0.0), first.get(pair[1], 0.0),
                            at - seconds)
            out[pair] = GpuReading(util, None, None, None if since is None else datetime.fromtimestamp(since, timezone.utc))
        return out


class ReportedUtilization:
    """Utilization from the node agents' reports, kept in memory: per GPU, since when
    it has been reported and when it was last busy (and memory, when reported)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._gpus: dict[str, tuple[datetime, datetime | None, datetime, float]] = {}  # first, busy, last, value
        self._memory: dict[str, tuple[int, int]] = {}  # used, total bytes
        # per GPU: since when its use has been attributable without a break, and the last report
        self._attributed: dict[str, tuple[datetime | None, datetime]] = {}
        self._users: dict[UserGpu, tuple[datetime | None, float]] = {}  # last busy, latest value
        self._lock = threading.Lock()

    def report(self, values: Mapping[str, float], at: datetime,
               memory: Mapping[str, tuple[int, int]] | None = None,
               users: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """A node's report: GPUs' utilization and memory, and per GPU whose use its agent
        could attribute, each user's figure (a user not named there used it not at all).
        A reported GPU without ``users`` is unknown per user from now on."""
        with self._lock:
            for uuid, value in values.items():
                first, busy, last, _ = self._gpus.get(uuid, (at, None, at, 0.0))
                if (at - last).total_seconds() > REPORT_STALE_SECONDS:
                    first, busy = at, None  # a gap in the reports: start over
                if value >= self.threshold:
                    busy = at
                self._gpus[uuid] = (first, busy, at, value)
            self._memory.update(memory or {})
            per_gpu = users or {}
            for uuid in set(values) | set(per_gpu):
                since, last = self._attributed.get(uuid, (None, at))
                if uuid not in per_gpu:
                    self._attributed[uuid] = (None, at)
                    continue
                if since is None or (at - last).total_seconds() > REPORT_STALE_SECONDS:
                    since = at
                self._attributed[uuid] = (since, at)
                known = {u for (u, g) in self._users if g == uuid} | set(per_gpu[uuid])
                for user in known:
                    value = float(per_gpu[uuid].get(user, 0.0))
                    busy_at = self._users.get((user, uuid), (None, 0.0))[0]
                    self._users[(user, uuid)] = (at if value >= self.threshold else busy_at, value)

    def _user_entry(self, pair: UserGpu, now: datetime, window: float) -> tuple[datetime, datetime | None, float] | None:
        """(attributable since, last busy, latest value) of one user on one GPU; None when the
        GPU's use is not attributable now or its agent went quiet."""
        since, last = self._attributed.get(pair[1], (None, now))
        if since is None or (now - last).total_seconds() > REPORT_STALE_SECONDS:
            return None
        busy, value = self._users.get(pair, (None, 0.0))
        return since, busy, value

    async def user_peak(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, float]:
        now = datetime.now(timezone.utc)
        with self._lock:
            known = {p: self._user_entry(p, now, window) for p in pairs}
        return _peaks(known, now - timedelta(seconds=window))

    async def user_readings(self, pairs: Iterable[UserGpu], window: float) -> dict[UserGpu, GpuReading]:
        now = datetime.now(timezone.utc)
        with self._lock:
            known = {p: self._user_entry(p, now, window) for p in pairs}
            return self._readings(known, lambda pair: pair[1], now, window)

    async def peak(self, uuids: Iterable[str], window: float) -> dict[str, float]:
        now = datetime.now(timezone.utc)
        with self._lock:
            known = {u: self._gpu_entry(u, now) for u in uuids}
        return _peaks(known, now - timedelta(seconds=window))

    def _gpu_entry(self, uuid: str, now: datetime) -> tuple[datetime, datetime | None, float] | None:
        """(reported since, last busy, latest value) of one GPU; None when never reported or
        its agent went quiet."""
        entry = self._gpus.get(uuid)
        if entry is None or (now - entry[2]).total_seconds() > REPORT_STALE_SECONDS:
            return None
        first, busy, _, value = entry
        return first, busy, value

    async def readings(self, uuids: Iterable[str], window: float) -> dict[str, GpuReading]:
        now = datetime.now(timezone.utc)
        with self._lock:
            known = {u: self._gpu_entry(u, now) for u in uuids}
            return self._readings(known, lambda uuid: uuid, now, window)

    def _readings(self, entries: Mapping[K, tuple[datetime, datetime | None, float] | None],
                  gpu_of: Callable[[K], str], now: datetime, window: float) -> dict[K, GpuReading]:
        """Readings from the entries (known since, last busy, latest value) that are known now;
        memory is the GPU's (``gpu_of`` the key), the idle run's start no further back than ``window``."""
        out = {}
        for key, entry in entries.items():
            if entry is None:
                continue  # never reported, or its agent went quiet: unknown
            first, busy, value = entry
            since = None if value >= self.threshold else max(busy or first, now - timedelta(seconds=window))
            used, total = self._memory.get(gpu_of(key), (None, None))
            out[key] = GpuReading(value, used, total, since)
        return out



def _peaks(entries: Mapping[K, tuple[datetime, datetime | None, float] | None], start: datetime) -> dict[K, float]:
    """The peak since ``start`` of each entry (known since, last busy, latest value), from
    reports that keep no history: fully busy if it was busy since ``start``, else its latest
    value. Left out where not known for the whole window (unknown, never idle)."""
    return {key: 1.0 if e[1] is not None and e[1] >= start else e[2]
            for key, e in entries.items() if e is not None and e[0] <= start}
