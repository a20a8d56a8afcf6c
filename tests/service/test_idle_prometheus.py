"""Idle reclaim's utilization from a real Prometheus with backfilled history.

The series are what the node agent exports (``gpupool_agent_gpu_utilization_ratio``
and the memory gauges, labels ``gpu_uuid, model, node, index``: agent/metrics.py)
and what DCGM's exporter exports (``DCGM_FI_DEV_GPU_UTIL`` 0-100 by ``UUID``, frame
buffer in MiB). History runs from two hours ago to a little after the test, so
"now" always falls inside it (one server for the module).

What a wrong answer would cost: an idle GPU reported busy is never given to the
people waiting; a busy GPU, or one nobody measured, reported idle loses its
owner's work. Prometheus being down must reclaim nothing and say so.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

import pytest

from gpupool_hub.placement import Request
from gpupool_hub.reasons import RefusalReason
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.common.hubapi import HubClient
from gpupool_hub.usage.utilization import PrometheusUtilization
from gpupool_hub.service.jobs.idle import IdleJob
from tests.fixtures.manager import make_manager, units_for
from tests.fixtures.prometheus import OpenMetricsHistory
from tests.fixtures.ports import free_port as _closed_port

pytestmark = pytest.mark.integration

R3090 = "NVIDIA GeForce RTX 3090"
AGENT = "gpupool_agent_gpu_utilization_ratio"
GIB = 1 << 30
MIB = 1 << 20


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(second=0, microsecond=0)


def agent_labels(uuid: str, index: int) -> dict[str, str]:
    return {"gpu_uuid": uuid, "model": R3090, "node": "node-a", "index": str(index)}


@pytest.fixture(scope="module")
def prom(prometheus_factory):
    now = _now()
    start, end = now - timedelta(hours=2), now + timedelta(minutes=30)
    h = OpenMetricsHistory()
    for i, uuid in enumerate(("GPU-a0", "GPU-a1")):  # alice's two 3090s: 0 % for two hours
        h.gauge(AGENT, agent_labels(uuid, i), [(start, end, 0.0)], step=15)
        h.gauge("gpupool_agent_gpu_memory_used_bytes", agent_labels(uuid, i), [(start, end, GIB)], step=15)
        h.gauge("gpupool_agent_gpu_memory_total_bytes", agent_labels(uuid, i), [(start, end, 24 * GIB)], step=15)
    # busy for the last ten minutes
    h.gauge(AGENT, agent_labels("GPU-busy", 2), [(start, now - timedelta(minutes=10), 0.0),
                                                 (now - timedelta(minutes=10), end, 0.9)], step=15)
    # worked until 45 minutes ago, idle since
    h.gauge(AGENT, agent_labels("GPU-was", 3), [(start, now - timedelta(minutes=45), 0.6),
                                                (now - timedelta(minutes=45), end, 0.0)], step=15)
    # measured only for the last five minutes (its agent just started)
    h.gauge(AGENT, agent_labels("GPU-new", 4), [(now - timedelta(minutes=5), end, 0.0)], step=15)
    # DCGM: 0-100 by UUID, memory in MiB
    for uuid, util in (("GPU-d0", 0), ("GPU-d1", 85)):
        labels = {"UUID": uuid, "gpu": uuid[-1], "Hostname": "node-d", "modelName": R3090}
        h.gauge("DCGM_FI_DEV_GPU_UTIL", labels, [(start, end, util)], step=15)
        h.gauge("DCGM_FI_DEV_FB_USED", labels, [(start, end, 512)], step=15)
        h.gauge("DCGM_FI_DEV_FB_FREE", labels, [(start, end, 24576 - 512)], step=15)
    server = prometheus_factory(h)
    server.now = now  # what "now" meant for the history
    return server


def agent_source(prom) -> PrometheusUtilization:
    return PrometheusUtilization(prom.url, threshold=0.05)


def dcgm_source(url: str) -> PrometheusUtilization:
    """The settings docs/admin-guide.md gives for DCGM."""
    return PrometheusUtilization(url, "DCGM_FI_DEV_GPU_UTIL", "UUID", 100, threshold=0.05,
                                 memory_used_query="DCGM_FI_DEV_FB_USED * 1048576",
                                 memory_total_query="(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1048576")


def test_agent_series_idle_busy_and_missing(prom):
    src = agent_source(prom)
    uuids = ["GPU-a0", "GPU-a1", "GPU-busy", "GPU-was", "GPU-new", "GPU-absent"]
    # the rule: the peak over the last hour; a GPU not measured for the whole hour is left out
    assert asyncio.run(src.peak(uuids, 3600)) == {"GPU-a0": 0.0, "GPU-a1": 0.0, "GPU-busy": 0.9, "GPU-was": 0.6}
    assert asyncio.run(src.peak(["GPU-was"], 1800)) == {"GPU-was": 0.0}  # idle for the last half hour

    got = asyncio.run(src.readings(uuids, 3600))
    assert set(got) == {"GPU-a0", "GPU-a1", "GPU-busy", "GPU-was", "GPU-new"}  # never measured: unknown
    now = datetime.now(timezone.utc)
    a0 = got["GPU-a0"]
    assert (a0.utilization, a0.memory_used_bytes, a0.memory_total_bytes) == (0.0, GIB, 24 * GIB)
    assert abs((a0.idle_since - (now - timedelta(hours=1))).total_seconds()) < 30  # as far back as looked
    assert got["GPU-busy"].utilization == 0.9 and got["GPU-busy"].idle_since is None
    # the idle run began at the last busy sample, 45 minutes (one 15 s sample) before "now"
    was = (prom.now - got["GPU-was"].idle_since).total_seconds()
    assert 45 * 60 <= was <= 45 * 60 + 30, was
    assert got["GPU-was"].memory_used_bytes is None  # no memory series for it: unknown, not 0
    new = (prom.now - got["GPU-new"].idle_since).total_seconds()
    assert 5 * 60 - 30 <= new <= 5 * 60 + 30, new


def test_dcgm_series_with_the_documented_settings(prom):
    src = dcgm_source(prom.url)
    assert asyncio.run(src.peak(["GPU-d0", "GPU-d1", "GPU-a0"], 3600)) == {"GPU-d0": 0.0, "GPU-d1": 0.85}
    got = asyncio.run(src.readings(["GPU-d0", "GPU-d1"], 3600))
    assert got["GPU-d0"].utilization == 0.0 and got["GPU-d0"].idle_since is not None
    assert got["GPU-d1"].utilization == 0.85 and got["GPU-d1"].idle_since is None
    assert (got["GPU-d1"].memory_used_bytes, got["GPU-d1"].memory_total_bytes) == (512 * MIB, 24576 * MIB)


NODE = [{"name": "node-a", "cpu_milli": 32000, "memory_mib": 131072,
         "gpus": [{"index": i, "uuid": f"GPU-a{i}", "model": R3090} for i in range(2)]}]


def alice_holds_and_bob_waits(tmp_path):
    m = make_manager(NODE, {"RTX 3090": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", queue_enabled=True,
                     idle_after=3600, idle_grace=600, min_runtime=0)
    m.admission.admit("alice", [], "", Request(gpus=2), None)
    with pytest.raises(Refused) as e:
        m.admission.admit("bob", [], "", Request(gpus=2), None)
    assert e.value.reason is RefusalReason.QUEUED
    return m


def test_the_idle_job_warns_alice_and_shows_her_gpus(prom, tmp_path):
    m = alice_holds_and_bob_waits(tmp_path)
    job = IdleJob(HubClient("http://127.0.0.1:9", "unused"), agent_source(prom), **units_for(IdleJob, m))
    asyncio.run(job())
    me = m.views.me("alice")
    [srv] = me["gpu_servers"]
    assert [(g["uuid"], g["utilization"], g["memory_used_bytes"], g["memory_total_bytes"]) for g in srv["gpus"]] == [
        ("GPU-a0", 0.0, GIB, 24 * GIB), ("GPU-a1", 0.0, GIB, 24 * GIB)]
    assert srv["idle_since"] and srv["reclaim_deadline"] == me["cull_warning"]["deadline"]
    deadline = datetime.fromisoformat(srv["reclaim_deadline"].replace("Z", "+00:00"))
    assert 590 <= (deadline - datetime.now(timezone.utc)).total_seconds() <= 600
    assert "idle" in me["cull_warning"]["reason"]
    [wait] = m.views.me("bob")["waiting"]
    assert wait["position"] == 1 and wait["queue_length"] == 1


def test_prometheus_down_reclaims_nothing_and_says_so(prom, prometheus_factory, tmp_path, caplog):
    m = alice_holds_and_bob_waits(tmp_path)
    gone = PrometheusUtilization(f"http://127.0.0.1:{_closed_port()}", threshold=0.05)
    job = IdleJob(HubClient("http://127.0.0.1:9", "unused"), gone, **units_for(IdleJob, m))
    with caplog.at_level(logging.WARNING, logger="gpupool.idle"):
        asyncio.run(job())
    assert "GPU utilization unavailable for idle reclaim (nothing is reclaimed)" in caplog.text
    me = m.views.me("alice")
    assert me["cull_warning"] is None and me["gpu_servers"][0]["idle_since"] is None
    assert me["gpu_servers"][0]["gpus"][0]["utilization"] is None  # unknown, not 0 %
    assert m.ledger.audit.of_actions(["idle_warn", "idle_reclaim"]) == []


def test_server_idleness_follows_the_rule():
    from gpupool_hub.takeback.idle import GpuReading, server_idleness

    t = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
    started = t - timedelta(hours=3)

    def idle_since(minutes):
        return GpuReading(0.0, None, None, t - timedelta(minutes=minutes))

    def of(*readings, start=started, max_idle=0.0):
        return server_idleness(start, readings, idle_after=3600, min_runtime=900, max_idle=max_idle)

    s = of(idle_since(90), idle_since(45))  # the server is idle since its last GPU went idle
    assert (s.idle_since, s.reclaimable_at, s.max_idle_at) == (
        t - timedelta(minutes=45), t + timedelta(minutes=15), None)
    assert of(idle_since(90), GpuReading(0.8, None, None, None)) is None  # one GPU busy: not idle
    assert of(idle_since(90), None) is None                              # one GPU unknown: not idle
    young = of(idle_since(120), start=t - timedelta(minutes=5))          # idle before it started
    assert young.idle_since == t - timedelta(minutes=5)                  # shown from its start,
    assert young.reclaimable_at == t + timedelta(minutes=10)             # protected for min_runtime
    assert of(idle_since(45), max_idle=7200).max_idle_at == t + timedelta(minutes=75)


def test_dry_run_audits_what_it_would_do_and_stops_warns_releases_nothing(prom, tmp_path, caplog):
    """``idle_dry_run``: the warning and the reclaim are logged and audited as dry runs;
    alice sees no warning, keeps her server and GPUs, and gets no notice."""
    m = alice_holds_and_bob_waits(tmp_path)
    m.settings.idle_dry_run = True
    m.settings.idle_grace = 0  # the reclaim is due at the next run
    # a hub that is not there: any stop_server would fail and be audited as "failed"
    job = IdleJob(HubClient("http://127.0.0.1:9", "unused"), agent_source(prom), **units_for(IdleJob, m))
    with caplog.at_level(logging.WARNING, logger="gpupool.idle"):
        asyncio.run(job())
        asyncio.run(job())
    assert "[dry run] would idle_warn for alice/-" in caplog.text
    assert "[dry run] would idle_reclaim for alice/-" in caplog.text
    events = m.ledger.audit.page(user="alice")
    assert [(e.action, e.dry_run) for e in events][::-1] == [("idle_warn", True), ("idle_reclaim", True)]
    me = m.views.me("alice")
    assert me["cull_warning"] is None and me["notices"] == []
    assert [a["user"] for a in me["allocations"]] == ["alice"]  # still held
    assert m.ledger.audit.of_actions(["failed"]) == []
