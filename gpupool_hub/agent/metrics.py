"""The agent's Prometheus metrics, in a registry of its own.

Per-user series are built from the latest snapshot at scrape time (a custom
collector) instead of long-lived labelled gauges: a user who stops using a GPU
simply disappears from the next scrape, and Prometheus writes a staleness
marker. That keeps the service's ``agent`` usage preset exact (see
docs/usage-sources.md) without the agent remembering label sets to zero out.
When NVML fails the snapshot is dropped, so no usage is claimed from stale
data.

``gpupool_agent_user_gpu_active{user,gpu_uuid,model,node}`` is the series the
service's ``usage_preset="agent"`` reads; its name and labels are a contract.
``gpupool_agent_user_gpu_utilization_ratio`` (same labels) is how busy the user's
processes kept the GPU; it is absent where unknown (several users and no
per-process samples), never someone else's figure. ``gpupool_agent_attribution_ok``
is 0 for a GPU whose use the agent cannot attribute (a failing process query,
memory NVML leaves empty, no per-process samples on a shared GPU); with 0, a
user without series on that GPU is unknown, not idle.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import scrape
from .attribution import Snapshot

USER_LABELS = ["user", "gpu_uuid", "model", "node"]
GPU_LABELS = ["gpu_uuid", "model", "node", "index"]


class _SnapshotCollector(Collector):
    def __init__(self, owner: "AgentMetrics") -> None:
        self.owner = owner

    def describe(self) -> list[Any]:
        return []  # dynamic series: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap, node, min_uid = self.owner.current()
        mem = GaugeMetricFamily("gpupool_agent_user_gpu_memory_bytes",
                                "GPU memory used by a user's processes on a GPU.", labels=USER_LABELS)
        count = GaugeMetricFamily("gpupool_agent_user_gpu_processes",
                                  "Number of a user's processes on a GPU.", labels=USER_LABELS)
        active = GaugeMetricFamily("gpupool_agent_user_gpu_active",
                                   "1 while the user has a process on the GPU (read by usage_preset='agent').",
                                   labels=USER_LABELS)
        busy = GaugeMetricFamily("gpupool_agent_user_gpu_utilization_ratio",
                                 "How busy a user's processes kept a GPU since the last sample (0-1); absent "
                                 "where unknown.", labels=USER_LABELS)
        attributed = GaugeMetricFamily("gpupool_agent_attribution_ok",
                                       "1 while every NVML call the per-user figures of a GPU rest on answers.",
                                       labels=["gpu_uuid", "node"])
        other = GaugeMetricFamily("gpupool_agent_gpu_other_processes",
                                  "Processes on a GPU not counted for any user: system accounts (uid below "
                                  "metrics_min_uid) or pids this agent cannot see.", labels=GPU_LABELS + ["kind"])
        util = GaugeMetricFamily("gpupool_agent_gpu_utilization_ratio",
                                 "GPU busy fraction over NVML's last sample period (0-1).", labels=GPU_LABELS)
        used = GaugeMetricFamily("gpupool_agent_gpu_memory_used_bytes", "GPU memory in use.", labels=GPU_LABELS)
        total = GaugeMetricFamily("gpupool_agent_gpu_memory_total_bytes", "GPU memory in total.", labels=GPU_LABELS)
        if snap is not None:
            per_user: dict[tuple[str, str, str], list[int | None]] = defaultdict(lambda: [0, 0])
            others: dict[tuple[str, str], int] = defaultdict(int)
            for p in snap.processes:
                if p.uid is None or p.user is None:
                    others[(p.gpu_uuid, "unknown")] += 1
                elif p.uid < min_uid:
                    others[(p.gpu_uuid, "system")] += 1
                else:
                    acc = per_user[(p.user, p.gpu_uuid, p.model)]
                    acc[0] = None if acc[0] is None or p.memory_bytes is None else acc[0] + p.memory_bytes
                    acc[1] += 1  # type: ignore[operator]
            users = {(u, g.uuid): v for g in snap.gpus for u, v in g.users.items()}
            for (user, uuid, model), (m, n) in sorted(per_user.items()):
                labels = [user, uuid, model, node]
                if m is not None:  # memory NVML left empty is unknown, not 0
                    mem.add_metric(labels, m)
                count.add_metric(labels, n)
                active.add_metric(labels, 1)
                if users.get((user, uuid)) is not None:
                    busy.add_metric(labels, users[(user, uuid)])
            for g in snap.gpus:
                attributed.add_metric([g.uuid, node], 1 if g.attribution_ok else 0)
                labels = [g.uuid, g.model, node, str(g.index)]
                total.add_metric(labels, g.memory_total_bytes)
                if g.memory_used_bytes is not None:
                    used.add_metric(labels, g.memory_used_bytes)
                if g.utilization is not None:
                    util.add_metric(labels, g.utilization)
                for kind in ("system", "unknown"):
                    if others.get((g.uuid, kind)):
                        other.add_metric(labels + [kind], others[(g.uuid, kind)])
        yield from (mem, count, active, busy, attributed, other, util, used, total)


class AgentMetrics:
    """All of the agent's metrics; ``update`` swaps in a new snapshot atomically."""

    def __init__(self, node: str, *, metrics_min_uid: int = 1000, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.metrics_min_uid = metrics_min_uid
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self.registry.register(_SnapshotCollector(self))
        r = self.registry
        self.nvml_up = Gauge("gpupool_agent_nvml_up", "1 if the last NVML discovery succeeded.", registry=r)
        self.service_up = Gauge("gpupool_agent_service_up",
                                "1 if the last exchange with the gpupool service succeeded.", registry=r)
        self.last_snapshot = Gauge("gpupool_agent_last_snapshot_timestamp_seconds",
                                   "Unix time of the last successful GPU process snapshot.", registry=r)
        self.enforcement_users = Gauge("gpupool_agent_enforcement_users",
                                       "Users the service currently asks this node to enforce.", registry=r)
        self.enforcement_actions = Counter(
            "gpupool_agent_enforcement_actions", "Enforcement decisions on GPU processes, by outcome.",
            ["user", "action"], registry=r)
        self.loop_errors = Counter("gpupool_agent_loop_errors", "Failed agent loop steps.", ["step"], registry=r)

    def update(self, snapshot: Snapshot | None) -> None:
        with self._lock:
            self._snapshot = snapshot
        if snapshot is not None:
            self.last_snapshot.set(snapshot.taken_at)

    def current(self) -> tuple[Snapshot | None, str, int]:
        with self._lock:
            return self._snapshot, self.node, self.metrics_min_uid

    def serve(self, port: int, address: str = "127.0.0.1", token: bytes | None = None) -> Any:
        """Serve ``/metrics`` in a daemon thread (works while the asyncio loop is busy); with
        ``token``, only to scrapes that bring it (:mod:`.scrape`).

        Returns the HTTP server (``.shutdown()`` stops it; ``.server_port`` is
        the bound port, useful with ``port=0``).
        """
        return scrape.serve(self.registry, port, address, token)
