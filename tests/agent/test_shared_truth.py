"""Per-user truth on a shared GPU (issue 23): real processes of two real Unix users on one
fake GPU, the agent's real code, the real service app (in-process, SQLite) and its pages.

What a wrong answer would cost: on a shared GPU the idle neighbour of a busy user is never
given to those waiting (or the busy one loses their work); a process query that fails in
silence bills nothing and guards nothing, with nobody told.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gpupool_hub.agent.activity import user_utilization
from gpupool_hub.agent.memguard import MemoryGuard, Share
from gpupool_hub.agent.enforce import Enforcer
from gpupool_hub.placement import Request
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.common.hubapi import HubClient
from gpupool_hub.service.jobs.idle import IdleJob
from gpupool_hub.usage.utilization import ReportedUtilization
from tests.agent.conftest import A100, GIB, gpu
from tests.agent.test_attribution_metrics import scrape, snapshot
from tests.agent.test_service import make_agent
from tests.fixtures.manager import make_manager, units_for
from tests.pages.inprocess import PagesService, attrs, user_model

T1, T2 = "gpupool-t1", "gpupool-t2"
TOKENS = {"n1": "secret-n1"}
NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768,
          "gpus": [{"index": 0, "uuid": "GPU-0000-fake", "model": A100},
                   {"index": 1, "uuid": "GPU-0001-fake", "model": A100}]}]
ADMIN = {"admin-login": user_model("ada", admin=True)}


def series(m: dict, name: str, *keys: str) -> dict:
    return {tuple(s.labels[k] for k in keys): s.value for s in m.get(name, [])}


async def until_async(step, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await step()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def test_a_busy_and_an_idle_user_on_one_gpu_each_get_their_own_figure(procs, make_nvml):
    busy, idle = procs.sleeper(T1), procs.sleeper(T2)
    alone = procs.sleeper(T1)
    nv = make_nvml([
        # the device says 90 %: all of it is t1's; t2's process worked not at all (no sample)
        gpu(0, utilization=90, processes=[{"pid": busy.pid, "memory": GIB, "sm": 90}, {"pid": idle.pid, "memory": GIB}]),
        # a user alone on a GPU whose driver has no per-process samples: the device's figure is exact
        gpu(1, utilization=73, processes=[{"pid": alone.pid, "memory": GIB}],
            fail={"nvmlDeviceGetProcessUtilization": 3}),
    ])
    agent = make_agent(nv, "")
    server = agent.metrics.serve(0, "127.0.0.1")
    try:
        agent.metrics.update(agent.sample()[2])
        m = scrape(server.server_port)
        assert series(m, "gpupool_agent_user_gpu_utilization_ratio", "user", "gpu_uuid") == {
            (T1, "GPU-0000-fake"): 0.9, (T2, "GPU-0000-fake"): 0.0, (T1, "GPU-0001-fake"): 0.73}
        assert all(set(s.labels) == {"user", "gpu_uuid", "model", "node"}
                   for s in m["gpupool_agent_user_gpu_utilization_ratio"])
        assert series(m, "gpupool_agent_attribution_ok", "gpu_uuid") == {("GPU-0000-fake",): 1, ("GPU-0001-fake",): 1}

        # nobody worked since the last sample: NVML's NOT_FOUND means 0 % for both, not unknown
        for p in nv.table["gpus"][0]["processes"]:
            p.pop("sm", None)
        agent.metrics.update(agent.sample()[2])
        m = scrape(server.server_port)
        assert series(m, "gpupool_agent_user_gpu_utilization_ratio", "user", "gpu_uuid")[(T1, "GPU-0000-fake")] == 0.0

        # a second user joins the GPU without samples: neither gets a figure, and the GPU says why
        nv.table["gpus"][1]["processes"].append({"pid": idle.pid, "memory": GIB})
        snap = agent.sample()[2]
        agent.metrics.update(snap)
        m = scrape(server.server_port)
        got = series(m, "gpupool_agent_user_gpu_utilization_ratio", "user", "gpu_uuid")
        assert (T1, "GPU-0001-fake") not in got and (T2, "GPU-0001-fake") not in got  # unknown, never 0.73
        assert series(m, "gpupool_agent_attribution_ok", "gpu_uuid")[("GPU-0001-fake",)] == 0
        assert "nvmlDeviceGetProcessUtilization failed: Not Supported" in snap.gpus[1].why_not()
    finally:
        server.shutdown()
        server.server_close()


def test_user_utilization_rules():
    class P:
        def __init__(self, pid, user):
            self.pid, self.user = pid, user

    a, b, ghost = P(1, "a"), P(2, "b"), P(3, None)
    assert user_utilization(0.5, [a, b], {1: 0.7, 2: 0.6, 9: 0.9}) == ({"a": 0.7, "b": 0.6}, False)
    assert user_utilization(0.5, [a, P(4, "a")], {1: 0.7, 4: 0.6}) == ({"a": 1.0}, False)  # capped
    assert user_utilization(0.5, [a], None) == ({"a": 0.5}, False)          # alone: the device's
    assert user_utilization(0.5, [a, ghost], None) == ({"a": None}, True)   # a pid nobody owns may be busy
    assert user_utilization(0.5, [a, b], None) == ({"a": None, "b": None}, True)


def shared_pool(tmp_path):
    """t1 and t2 share GPU 0 (half each), t1 holds GPU 1 alone, and bob waits for an A100."""
    m = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path}/ledger.sqlite", queue_enabled=True,
                     idle_after=0.5, idle_grace=0, min_runtime=0, idle_dry_run=True)
    shared = {u: m.admission.admit(u, [], "", Request(gpu_milli=500), None) for u in (T1, T2)}
    alone = m.admission.admit(T1, [], "solo", Request(gpus=1), None)
    assert {g["uuid"] for r in shared.values() for g in r.gpus} == {"GPU-0000-fake"}
    assert [g["uuid"] for g in alone.gpus] == ["GPU-0001-fake"]
    with pytest.raises(Refused):
        m.admission.admit("bob", [], "", Request(gpus=1), None)
    return m, shared, alone


async def test_the_idle_user_next_to_a_busy_one_is_reclaimed_and_the_busy_one_is_not(procs, make_nvml, tmp_path,
                                                                                   caplog):
    m, shared, alone = shared_pool(tmp_path)
    busy, idle, solo = procs.sleeper(T1), procs.sleeper(T2), procs.sleeper(T1)
    nv = make_nvml([
        gpu(0, utilization=90, processes=[{"pid": busy.pid, "memory": GIB, "sm": 90}, {"pid": idle.pid, "memory": GIB}]),
        gpu(1, utilization=60, processes=[{"pid": solo.pid, "memory": GIB}]),  # busy by the device's figure
    ])
    source = ReportedUtilization(m.settings.idle_threshold)
    service = PagesService(m, ADMIN, agent_tokens=dict(TOKENS), utilization=source)
    try:
        agent = make_agent(nv, service.origin + "/services/gpupool/")
        job = IdleJob(HubClient("http://127.0.0.1:9", "unused"), source, **units_for(IdleJob, m))

        def said(action):  # a dry run (no hub to stop servers through) logs each decision
            return [r.getMessage() for r in caplog.records if r.name == "gpupool.idle" and f"would {action}" in
                    r.getMessage()]

        async def reclaimed():
            assert (await agent.tick()).service_ok
            await job()
            return said("idle_reclaim")

        with caplog.at_level(logging.WARNING, logger="gpupool.idle"):
            [reclaim] = await until_async(reclaimed, "the idle share is reclaimed")
        assert f"for {T2}/-:" in reclaim
        assert "its own processes on its shared GPU have been idle" in reclaim and "at 0 % of its share" in reclaim
        assert all(f"for {T2}/-:" in line for line in said("idle_warn"))  # t1 busy: both its servers are kept

        # GET pool and the pool map show each server's own figure, not the GPU's 90 %
        pool = m.views.pool_report(m.ledger.allocations.active_holders(), m.idle.idle_since(), m.idle.own_utilization())
        holders = {h["user"]: h for g in pool["nodes"][0]["gpus"] if g["index"] == 0 for h in g["holders"]}
        assert (holders[T1]["utilization"], holders[T2]["utilization"]) == (0.9, 0.0)
        assert "idle_since" in holders[T2] and "idle_since" not in holders[T1]
        page = (await service.client("admin-login").get("admin/pool")).body.decode()
        figures = {a["data-allocation"]: a for a in attrs(page, 'class="holder" data-allocation')}
        assert set(figures) >= {shared[T1].id, shared[T2].id, alone.id}
        assert "0 % busy" in page and "90 % busy" in page and "60 % busy" in page
    finally:
        service.stop()


async def test_a_failing_process_query_is_loud_once_and_its_recovery_too(procs, make_nvml, tmp_path, caplog):
    m = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path}/ledger.sqlite")
    a, b = procs.sleeper(T1), procs.sleeper(T2)
    nv = make_nvml([gpu(0, processes=[{"pid": a.pid, "memory": GIB, "sm": 50}, {"pid": b.pid, "memory": GIB}]),
                    gpu(1)])
    service = PagesService(m, ADMIN, agent_tokens=dict(TOKENS))
    agent = make_agent(nv, service.origin + "/services/gpupool/")
    metrics = agent.metrics.serve(0, "127.0.0.1")
    browser = service.client("admin-login")
    call = "nvmlDeviceGetComputeRunningProcesses"
    try:
        nv.table["gpus"][0]["fail"] = {call: 4}  # NVML_ERROR_NO_PERMISSION
        with caplog.at_level(logging.WARNING, logger="gpupool.agent.attribution"):
            for _ in range(3):
                assert (await agent.tick()).service_ok
        failing = [r for r in caplog.records if r.name == "gpupool.agent.attribution"]
        assert len(failing) == 1, [r.getMessage() for r in failing]
        assert "GPU-0000-fake" in failing[0].getMessage() and call in failing[0].getMessage()
        assert failing[0].levelno == logging.WARNING
        m_ = scrape(metrics.server_port)
        assert series(m_, "gpupool_agent_attribution_ok", "gpu_uuid") == {("GPU-0000-fake",): 0, ("GPU-0001-fake",): 1}
        assert series(m_, "gpupool_agent_user_gpu_active", "user", "gpu_uuid") == {}  # nothing claimed on a guess
        page = (await browser.get("admin/pool")).body.decode()
        assert len(attrs(page, 'data-gpupool="cannot-attribute"')) == 1
        assert f"cannot attribute: {call} failed: Insufficient Permissions" in page
        [gpu0] = [g for g in m.views.pool_report([], {})["nodes"][0]["gpus"] if g["index"] == 0]
        assert gpu0["cannot_attribute"].startswith(f"{call} failed")
        report = agent.sample()[2]
        assert report.gpus[0].problems and not report.gpus[1].problems  # the agent's own report says so too

        caplog.clear()
        del nv.table["gpus"][0]["fail"]
        with caplog.at_level(logging.WARNING, logger="gpupool.agent.attribution"):
            assert (await agent.tick()).service_ok
            assert (await agent.tick()).service_ok
        [recovered] = [r for r in caplog.records if r.name == "gpupool.agent.attribution"]
        assert "works again" in recovered.getMessage() and "GPU-0000-fake" in recovered.getMessage()
        m_ = scrape(metrics.server_port)
        assert series(m_, "gpupool_agent_attribution_ok", "gpu_uuid") == {("GPU-0000-fake",): 1, ("GPU-0001-fake",): 1}
        assert series(m_, "gpupool_agent_user_gpu_utilization_ratio", "user", "gpu_uuid") == {
            (T1, "GPU-0000-fake"): 0.5, (T2, "GPU-0000-fake"): 0.0}
        assert "cannot attribute" not in (await browser.get("admin/pool")).body.decode()
    finally:
        metrics.shutdown()
        metrics.server_close()
        service.stop()


def test_memory_nvml_leaves_empty_is_unknown_and_the_guard_estimates_it(procs, make_nvml, caplog):
    hidden, known = procs.sleeper(T1), procs.sleeper(T2)
    # 60 GiB in use; NVML attributes 10 GiB to t2 and leaves t1's empty: 50 GiB are t1's
    nv = make_nvml([gpu(0, memory_used=60 * GIB, processes=[{"pid": hidden.pid, "memory": None, "sm": 10},
                                                           {"pid": known.pid, "memory": 10 * GIB, "sm": 0}])])
    snap = snapshot(nv)
    assert "usedGpuMemory" in snap.gpus[0].problems and str(hidden.pid) in snap.gpus[0].why_not()
    assert {p.pid: p.memory_bytes for p in snap.processes} == {hidden.pid: None, known.pid: 10 * GIB}

    from gpupool_hub.agent.metrics import AgentMetrics
    from prometheus_client import generate_latest

    metrics = AgentMetrics("n1", metrics_min_uid=100)
    metrics.update(snap)
    text = generate_latest(metrics.registry).decode()
    assert f'gpupool_agent_user_gpu_memory_bytes{{gpu_uuid="GPU-0000-fake",model="{A100}",node="n1",user="{T2}"}}' in text
    assert f'user="{T1}"}} ' not in text.split("gpupool_agent_user_gpu_memory_bytes", 2)[-1].split("# HELP")[0]
    assert 'gpupool_agent_attribution_ok{gpu_uuid="GPU-0000-fake",node="n1"} 0.0' in text

    guard = MemoryGuard(Enforcer(min_uid=100, dry_run=True), tolerance=0.10)
    with caplog.at_level(logging.WARNING, logger="gpupool.agent.memguard"):
        [w] = guard.observe(snap, [Share("GPU-0000-fake", T1, "", 500), Share("GPU-0000-fake", T2, "", 500)], 0.0)
    assert (w.user, w.usage.used_bytes, w.usage.estimated) == (T1, 50 * GIB, True)  # over 44 GiB: not 0
    assert "estimated" in caplog.text
