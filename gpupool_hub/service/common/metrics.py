"""Prometheus metrics of the service, in a registry of its own.

Balances and allocations are collected at scrape time from the ledger and the
pool, so they can never drift from the truth between scrapes. What the GPUs did
(tokens charged, held, busy and unknown GPU-seconds) is counted as the debit and
gpu-use jobs write it, once per written interval: summing the ledger's history
on every scrape would grow with it, and the counters only ever carry the users
who had GPU time since the service started (Prometheus' ``increase`` spans
restarts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.threads import writes

if TYPE_CHECKING:
    from ...ledger import AllocationRecord, GpuUse, Posting
    from ..core.manager import PoolManager

#: a wait in the queue: seconds to a day
WAIT_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)


def held_gpus(record: AllocationRecord) -> dict[str, float]:
    """GPUs one allocation holds per model, fractions and MIG instances as shares: the value of
    its ``gpupool_allocated_gpus`` series, which the ``gpupool`` usage preset charges (and
    benchmarks/scale.py backfills into Prometheus as this gauge would have been scraped)."""
    shares: dict[str, float] = {}
    for g in record.gpus:
        shares[g["model"]] = shares.get(g["model"], 0.0) + g["milli"] / 1000
    return shares


class PoolCollector(Collector):
    def __init__(self, manager: PoolManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        balance = GaugeMetricFamily("gpupool_balance_tokens", "Token balance per user", labels=["user"])
        after = None
        while True:
            page = self.manager.ledger.accounts(limit=1000, after=after)
            for acct in page:
                balance.add_metric([acct.name], float(acct.balance))
            if len(page) < 1000:
                break
            after = page[-1].name
        yield balance
        held = GaugeMetricFamily(
            "gpupool_allocated_gpus", "GPUs held and charged by an allocation (fractions as shares; none while its batch job is pending)",
            labels=["user", "server", "model", "node", "allocation"],
        )
        per_model: dict[str, float] = {}
        for record in self.manager.ledger.allocations.active():
            if record.charged_from is None:  # a batch job still pending in its scheduler: not charged
                continue
            for model, share in held_gpus(record).items():
                held.add_metric([record.user, record.server, model, record.node, record.id], share)
                per_model[model] = per_model.get(model, 0.0) + share
        yield held
        by_model = GaugeMetricFamily("gpupool_allocated_gpus_by_model", "GPUs allocated per model", labels=["model"])
        capacity = GaugeMetricFamily("gpupool_capacity_gpus", "GPUs in the pool per model", labels=["model"])
        cap: dict[str, int] = {}
        for ns in self.manager.pool.nodes:
            for g in ns.node.gpus:
                cap[g.model] = cap.get(g.model, 0) + 1
        for model, n in sorted(cap.items()):
            capacity.add_metric([model], n)
            by_model.add_metric([model], per_model.get(model, 0.0))
        yield by_model
        yield capacity
        waiting = GaugeMetricFamily(
            "gpupool_queue_waiting", "Servers waiting for GPUs of a model (one that accepts several models counts "
            "under each)", labels=["model"])
        for model, n in self.manager.queue.reports.waiting_per_model().items():
            waiting.add_metric([model], n)
        yield waiting
        report = self.manager.reclaims.team_report()
        if report["enabled"]:
            quota = GaugeMetricFamily("gpupool_team_quota_gpus", "Nominal GPU quota per team", labels=["team"])
            used = GaugeMetricFamily("gpupool_team_allocated_gpus", "GPUs a team holds (incl. reserved)", labels=["team"])
            borrowed = GaugeMetricFamily("gpupool_team_borrowed_gpus", "GPUs a team holds above its quota (borrowed)",
                                         labels=["team"])
            preempted = CounterMetricFamily("gpupool_team_preemptions", "Borrowed servers of a team preempted",
                                            labels=["team"])
            for t in report["teams"]:
                quota.add_metric([t["team"]], t["quota_gpus"])
                used.add_metric([t["team"]], t["used_gpus"])
                borrowed.add_metric([t["team"]], t["borrowed_gpus"])
                preempted.add_metric([t["team"]], t["preempted"])
            yield from (quota, used, borrowed, preempted)


class ServiceMetrics:
    def __init__(self, manager: PoolManager) -> None:
        self.threads = manager.threads
        self.registry = CollectorRegistry()
        self.registry.register(PoolCollector(manager))
        self.queue_wait = Histogram(
            "gpupool_queue_wait_seconds", "How long a waiting server waited until its GPUs were placed",
            registry=self.registry, buckets=WAIT_BUCKETS,
        )
        manager.queue.report_to(self.observe_wait)
        self.job_duration = Histogram(
            "gpupool_job_duration_seconds", "Duration of a scheduled job run", ["job"], registry=self.registry,
        )
        self.job_failures = Counter(
            "gpupool_job_failures", "Scheduled job runs that failed", ["job"], registry=self.registry,
        )
        self.api_latency = Histogram(
            "gpupool_api_request_duration_seconds", "API request latency", ["handler", "method", "code"],
            registry=self.registry, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.tokens_charged = Counter(
            "gpupool_tokens_charged", "Tokens debited for GPU time, per user", ["user"], registry=self.registry,
        )
        self.gpu_held = Counter(
            "gpupool_gpu_held_seconds", "GPU-seconds held (shares as fractions), per user and team",
            ["user", "team"], registry=self.registry,
        )
        self.gpu_busy = Counter(
            "gpupool_gpu_busy_seconds", "Held GPU-seconds the server's own processes kept busy",
            ["user", "team"], registry=self.registry,
        )
        self.gpu_unknown = Counter(
            "gpupool_gpu_unknown_seconds", "Held GPU-seconds whose use could not be measured (neither busy nor idle)",
            ["user", "team"], registry=self.registry,
        )

    def observe_wait(self, seconds: float) -> None:
        """Called by the queue as a waiter's GPUs are claimed, with how long it waited."""
        self.queue_wait.observe(seconds)

    def count_charges(self, postings: Iterable[Posting]) -> None:
        """Called by the debit job once an interval's debits are in the ledger."""
        for p in postings:
            if p.kind == "debit" and p.amount < 0:
                self.tokens_charged.labels(p.account).inc(float(-p.amount))

    def count_gpu_use(self, rows: Iterable[GpuUse]) -> None:
        """Called by the gpu-use job once an interval's rows are in the ledger (never for a rerun)."""
        for r in rows:
            labels = (r.user, r.team)
            self.gpu_held.labels(*labels).inc(r.held_milli / 1000)
            self.gpu_busy.labels(*labels).inc(r.busy_milli / 1000)
            self.gpu_unknown.labels(*labels).inc(r.unknown_milli / 1000)

    @writes
    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format. On the writer thread: the collectors read
        the pool and the core's caches, which only the writer changes."""
        return generate_latest(self.registry)
