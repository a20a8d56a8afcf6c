"""Per-user utilization on shared GPUs from a real Prometheus with backfilled history
(issue 23 items 1-2): ``PrometheusUtilization.user_peak`` / ``user_readings`` over the
node agent's ``gpupool_agent_user_gpu_utilization_ratio{user,gpu_uuid,model,node}`` and
``gpupool_agent_attribution_ok{gpu_uuid,node}``, and the cull job's pressure rule, which
judges each server by its own figure.

What a wrong answer would cost: a user next to a busy neighbour read as busy keeps a GPU
share others wait for; a busy user read as idle, or one the agent could not attribute
read as 0 %, loses their work.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from traitlets.config import Config

from gpupool_hub.takeback.cull import Culler
from gpupool_hub.placement import Request
from gpupool_hub.service.jobs.cull import CullJob, ServerUtilization
from gpupool_hub.usage.utilization import PrometheusUtilization
from tests.fixtures.manager import make_manager, units_for
from tests.fixtures.prometheus import OpenMetricsHistory

pytestmark = pytest.mark.integration

A100 = "NVIDIA A100-SXM4-80GB"
USER = "gpupool_agent_user_gpu_utilization_ratio"
OK = "gpupool_agent_attribution_ok"
GPU = "gpupool_agent_gpu_utilization_ratio"


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(second=0, microsecond=0)


def user_labels(user: str, uuid: str) -> dict[str, str]:
    return {"user": user, "gpu_uuid": uuid, "model": A100, "node": "n1"}


def gpu_labels(uuid: str) -> dict[str, str]:
    return {"gpu_uuid": uuid, "node": "n1"}


@pytest.fixture(scope="module")
def prom(prometheus_factory):
    now = _now()
    start, end = now - timedelta(hours=2), now + timedelta(minutes=30)
    h = OpenMetricsHistory()
    # GPU-s: alice busy (90 %) all along; bob worked (50 %) until 45 minutes ago, idle since;
    # eve holds a share but never ran a process there (no series of hers at all)
    h.gauge(GPU, {**gpu_labels("GPU-s"), "model": A100, "index": "0"}, [(start, end, 0.9)], step=15)
    h.gauge(OK, gpu_labels("GPU-s"), [(start, end, 1)], step=15)
    h.gauge(USER, user_labels("alice", "GPU-s"), [(start, end, 0.9)], step=15)
    h.gauge(USER, user_labels("bob", "GPU-s"), [(start, now - timedelta(minutes=45), 0.5),
                                               (now - timedelta(minutes=45), end, 0.0)], step=15)
    # GPU-x: the agent cannot attribute it (its process query fails) for the last 20 minutes
    h.gauge(OK, gpu_labels("GPU-x"), [(start, now - timedelta(minutes=20), 1),
                                      (now - timedelta(minutes=20), end, 0)], step=15)
    h.gauge(USER, user_labels("carol", "GPU-x"), [(start, now - timedelta(minutes=20), 0.0)], step=15)
    # GPU-r: could not attribute 30-20 minutes ago, fine since; frank idle all along
    h.gauge(OK, gpu_labels("GPU-r"), [(start, now - timedelta(minutes=30), 1),
                                      (now - timedelta(minutes=30), now - timedelta(minutes=20), 0),
                                      (now - timedelta(minutes=20), end, 1)], step=15)
    h.gauge(USER, user_labels("frank", "GPU-r"), [(start, end, 0.0)], step=15)
    # GPU-n: its agent started ten minutes ago
    h.gauge(OK, gpu_labels("GPU-n"), [(now - timedelta(minutes=10), end, 1)], step=15)
    h.gauge(USER, user_labels("gus", "GPU-n"), [(now - timedelta(minutes=10), end, 0.0)], step=15)
    server = prometheus_factory(h)
    server.now = now
    return server


def source(prom) -> PrometheusUtilization:
    return PrometheusUtilization(prom.url, threshold=0.05)


PAIRS = [("alice", "GPU-s"), ("bob", "GPU-s"), ("eve", "GPU-s"), ("carol", "GPU-x"), ("frank", "GPU-r"),
         ("gus", "GPU-n"), ("alice", "GPU-absent")]


def test_user_peak_is_each_users_own_and_unknown_where_not_attributable(prom):
    src = source(prom)
    # over the last hour: alice's own 90 %, bob's 50 % (before he stopped), eve's nothing (0);
    # carol, frank (a failed query inside the hour), gus (too young) and a GPU nobody measured: unknown
    assert asyncio.run(src.user_peak(PAIRS, 3600)) == {
        ("alice", "GPU-s"): 0.9, ("bob", "GPU-s"): 0.5, ("eve", "GPU-s"): 0.0}
    # over the last half hour bob is idle, although the GPU he shares is 90 % busy
    assert asyncio.run(src.user_peak([("bob", "GPU-s")], 1800)) == {("bob", "GPU-s"): 0.0}
    # frank's GPU is attributable for the last 15 minutes, gus's for the last 5
    assert asyncio.run(src.user_peak(PAIRS, 900)) == {
        ("alice", "GPU-s"): 0.9, ("bob", "GPU-s"): 0.0, ("eve", "GPU-s"): 0.0, ("frank", "GPU-r"): 0.0}
    assert asyncio.run(src.user_peak([], 900)) == {}


def test_user_readings_show_own_figures_and_idle_runs(prom):
    got = asyncio.run(source(prom).user_readings(PAIRS, 3600))
    assert set(got) == {("alice", "GPU-s"), ("bob", "GPU-s"), ("eve", "GPU-s"), ("frank", "GPU-r"),
                        ("gus", "GPU-n")}  # carol's GPU cannot be attributed now: unknown, never 0 %
    alice, bob, eve = got[("alice", "GPU-s")], got[("bob", "GPU-s")], got[("eve", "GPU-s")]
    assert (alice.utilization, alice.idle_since) == (0.9, None)
    assert bob.utilization == 0.0 and eve.utilization == 0.0

    def minutes_idle(reading) -> float:
        return (prom.now - reading.idle_since).total_seconds() / 60

    assert 45 <= minutes_idle(bob) <= 45.5                    # since his last busy sample
    now = datetime.now(timezone.utc)
    assert abs((eve.idle_since - (now - timedelta(hours=1))).total_seconds()) < 30  # as far back as looked
    assert 20 <= minutes_idle(got[("frank", "GPU-r")]) <= 20.5  # since its last unattributable sample
    assert 9.5 <= minutes_idle(got[("gus", "GPU-n")]) <= 10.5   # since his GPU was first measured


NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768,
          "gpus": [{"index": i, "uuid": uuid, "model": A100} for i, uuid in enumerate(("GPU-s", "GPU-x", "GPU-r"))]}]


def test_cull_pressure_judges_each_server_by_its_own_figure(prom, tmp_path):
    """alice (90 %) and bob (0 %) share GPU-s; carol holds GPU-x, which cannot be attributed.
    Both alice and bob are in debt; the pool is under utilization pressure at 25 %. The GPU
    reads 90 %, yet only bob, next to alice's work, is under pressure: her own work is none
    on her, and carol's unknown GPU counts neither way."""
    m = make_manager(NODES, {"A100": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", min_runtime=0)
    for user in ("alice", "bob"):
        m.admission.admit(user, [], "", Request(gpu_milli=500), None)
        m.accounts.grant(user, -m.ledger.balance(user) - 1, "in debt", "test", None)  # under 0, over the floor
    [carol] = [m.admission.admit("carol", [], "", Request(gpus=1), None)]
    assert [g["uuid"] for g in carol.gpus] != ["GPU-s"]
    c = Config()
    c.Culler.pressure_utilization = 0.25
    c.Culler.pressure_allocated_fraction = 0.99
    culler = Culler(config=c)

    async def no_groups(user):
        return []

    job = CullJob(None, culler, no_groups, ServerUtilization(culler, source(prom)), **units_for(CullJob, m))
    asyncio.run(job())
    warned = m.enforcement.warnings
    assert set(warned) == {"bob"}, warned
    # 0.9 of alice's over the 1.5 GPUs neither bob's nor unknown (3 - 0.5 - 1)
    assert "other users' servers keep the GPUs 60% busy" in warned["bob"].reason


def test_cull_pressure_off_or_unreadable_is_no_utilization_pressure(prom, tmp_path, caplog):
    m = make_manager(NODES, {"A100": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", min_runtime=0)
    records = [m.admission.admit("alice", [], "", Request(gpu_milli=500), None)]
    off = ServerUtilization(Culler(), source(prom))
    assert asyncio.run(off(records)) is None
    c = Config()
    c.Culler.pressure_utilization = 0.25
    gone = ServerUtilization(Culler(config=c), PrometheusUtilization("http://127.0.0.1:9", threshold=0.05))
    assert asyncio.run(gone(records)) is None
    assert "GPU utilization unavailable for the pressure check" in caplog.text
