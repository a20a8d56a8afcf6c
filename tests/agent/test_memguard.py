"""Issue 16.2, shares kept to their memory: the real agent against the real service.

Real processes under real (test) accounts stand for the CUDA processes; the fake
NVML lists them with the GPU memory the test says. Each test walks one scenario
through ``agent.tick()``, the service's ``nodes/{node}/memory`` endpoints,
``GET me`` and the audit log.
"""

from __future__ import annotations

import time

import pytest

from gpupool_hub.agent.enforce import SKIPPED_ROOT, TERMINATED, WOULD_TERMINATE
from gpupool_hub.agent.memguard import Share, measure, pick_victims
from gpupool_hub.agent.attribution import GpuProcess, GpuStatus, Snapshot
from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.reasons import AuditAction
from tests.agent.conftest import GIB, alive, gpu
from tests.agent.test_service import Service, make_agent
from tests.service.openapi import check

ALICE, BOB = "gpupool-t1", "gpupool-t2"


class UserTokens:
    """Hub tokens of the two test users (each sees only their own ``me``)."""

    async def user_for_token(self, token, sync=False):
        return {"alice-token": {"kind": "user", "name": ALICE, "scopes": []},
                "bob-token": {"kind": "user", "name": BOB, "scopes": []}}.get(token)


def start(tmp_path, **settings) -> Service:
    svc = Service(tmp_path, **settings)
    svc.app.settings["context"].hub_auth = UserTokens()
    return svc


def half(svc: Service, user: str) -> str:
    """``user`` is given a 0.5 share; returns the GPU's UUID."""
    record = svc.manager.admission.admit(user, [], "", parse_request({"gpu_fraction": 0.5}))
    assert record is not None and record.gpus[0]["milli"] == 500, record
    return record.gpus[0]["uuid"]


def table(placement: dict[str, list[tuple[int, int]]]) -> list[dict]:
    """Fake NVML rows: per GPU UUID, (pid, GiB) of the processes on it."""
    return [gpu(i, processes=[{"pid": pid, "memory": gib * GIB} for pid, gib in placement.get(f"GPU-{i:04d}-fake", [])])
            for i in range(2)]


async def tick_until(agent, done, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await agent.tick()
        if done(result):
            return result
    raise AssertionError("condition never met")


async def test_a_share_over_its_memory_is_warned_then_its_biggest_process_stopped(
        tmp_path, procs, test_users, make_nvml):
    svc = start(tmp_path)
    try:
        shared = half(svc, ALICE)
        assert half(svc, BOB) == shared  # the two halves share one GPU
        other = half(svc, "root")        # root holds a share too, and goes over it
        big, small = procs.sleeper(ALICE), procs.sleeper(ALICE)
        neighbour = procs.sleeper(BOB)
        root = procs.sleeper(None)
        # 80 GiB GPUs: a 0.5 share may hold 40 GiB x 1.1 = 44 GiB
        nv = make_nvml(table({shared: [(big.pid, 30), (small.pid, 20), (neighbour.pid, 30)],
                              other: [(root.pid, 60)]}))
        agent = make_agent(nv, svc.url, memory_grace=2.0)

        result = await agent.tick()
        assert {(w.usage.user, w.usage.gpu_uuid) for w in result.memory_warnings} == {(ALICE, shared), ("root", other)}
        assert result.memory_actions == []  # warned, nothing stopped

        code, me = await svc.call("GET", "me", "alice-token")
        assert code == 200, me
        check("Me", me)
        (warning,) = me["memory_warnings"]
        assert warning["gpu_uuid"] == shared and warning["fraction_milli"] == 500
        assert warning["limit_bytes"] == 44 * GIB and warning["used_bytes"] == 50 * GIB and warning["deadline"]
        code, me = await svc.call("GET", "me", "bob-token")
        assert code == 200 and me["memory_warnings"] == []  # bob is under his limit, and never sees alice's

        result = await agent.tick()  # the grace is not over: nothing stops
        assert result.memory_actions == [] and alive(big.pid)

        result = await tick_until(agent, lambda r: r.memory_actions)
        outcome = {a.pid: a.action for a in result.memory_actions}
        assert outcome == {big.pid: TERMINATED, root.pid: SKIPPED_ROOT}  # the biggest only: 20 GiB fit
        big.wait(5)
        assert big.returncode == -15  # a real SIGTERM
        assert alive(small.pid) and alive(neighbour.pid) and alive(root.pid)

        # alice is back under her limit: the warning goes
        nv.table["gpus"] = table({shared: [(small.pid, 20), (neighbour.pid, 30)], other: [(root.pid, 60)]})
        result = await agent.tick()
        assert [w.usage.user for w in result.memory_warnings] == ["root"]
        assert result.memory_actions == []  # root's refusal is not tried (and audited) again every tick
        assert (await svc.call("GET", "me", "alice-token"))[1]["memory_warnings"] == []

        events = svc.manager.ledger.audit.page(user=ALICE)
        assert [e.action for e in reversed(events)] == [AuditAction.MEMORY_WARN.value, AuditAction.MEMORY_STOP.value]
        assert f"pid {big.pid} (30720 MiB on GPU {shared}): terminated" in events[0].reason
        assert not any(e.dry_run for e in events)
        assert svc.manager.ledger.audit.page(user=BOB) == []
    finally:
        svc.stop()


async def test_dry_run_warns_nobody_and_stops_nothing(tmp_path, procs, test_users, make_nvml):
    svc = start(tmp_path, agent_dry_run=True)
    try:
        shared = half(svc, ALICE)
        hog = procs.sleeper(ALICE)
        nv = make_nvml(table({shared: [(hog.pid, 70)]}))
        agent = make_agent(nv, svc.url, memory_grace=0.2)
        result = await tick_until(agent, lambda r: r.memory_actions)
        assert [a.action for a in result.memory_actions] == [WOULD_TERMINATE]
        assert (await agent.tick()).memory_actions == []  # logged once per warning, not every tick
        assert alive(hog.pid)
        assert (await svc.call("GET", "me", "alice-token"))[1]["memory_warnings"] == []
        events = svc.manager.ledger.audit.page(user=ALICE)
        assert {e.action for e in events} == {"memory_warn", "memory_stop"} and all(e.dry_run for e in events)
    finally:
        svc.stop()


async def test_nothing_is_stopped_unless_the_warning_reached_the_service(tmp_path, procs, test_users, make_nvml):
    svc = start(tmp_path)
    shared = half(svc, ALICE)
    hog = procs.sleeper(ALICE)
    agent = make_agent(make_nvml(table({shared: [(hog.pid, 70)]})), svc.url, memory_grace=0.0)
    shares, _dry = await agent.client.memory_shares()
    svc.stop()  # the service goes away before the warning could be reported
    result = await agent.tick()
    assert result.service_ok is False and result.memory_actions == [] and alive(hog.pid)
    # the guard on its own: a warning never accepted has no deadline, so nothing is due
    snap = result.snapshot
    agent.memguard.observe(snap, shares, time.time())
    assert agent.memguard.enforce(snap, time.time() + 3600) == [] and alive(hog.pid)


def _proc(pid: int, gib: int, user: str = "u", mig: str | None = None) -> GpuProcess:
    return GpuProcess(pid=pid, gpu_index=0, gpu_uuid="G", model="m", memory_bytes=gib * GIB, mig_uuid=mig,
                      uid=1000, user=user)


@pytest.mark.parametrize("milli,tolerance,procs_gib,over,victims", [
    (500, 0.10, [30, 20], True, [1]),        # 50 > 44: the biggest goes, 20 fits
    (500, 0.10, [20, 20, 4], False, []),     # 44 is the limit itself: not over
    (250, 0.0, [10, 10, 10, 5], True, [1, 2]),  # 35 > 20: two of them (biggest, then by pid)
    (500, 0.10, [50], True, [1]),
])
def test_limit_and_victims(milli, tolerance, procs_gib, over, victims):
    snap = Snapshot(0.0, [GpuStatus(0, "G", "m", 80 * GIB, None, None)],
                    [_proc(i + 1, g) for i, g in enumerate(procs_gib)] + [_proc(9, 70, user="v"), _proc(8, 70, mig="MIG-1")])
    (usage,) = measure(snap, [Share("G", "u", "", milli)], tolerance)
    assert usage.over is over and usage.used_bytes == sum(procs_gib) * GIB  # another user's and MIG processes aside
    assert [p.pid for p in pick_victims(usage)] == victims
    # a whole GPU is not guarded
    assert measure(snap, [Share("G", "u", "a", 500), Share("G", "u", "b", 500)], tolerance) == []


def test_a_share_gets_memory_hints_in_its_environment_a_whole_gpu_none(tmp_path):
    from types import SimpleNamespace

    from traitlets.config import Config

    from gpupool_hub.engines.local.spawner import GPUPoolLocalProcessSpawner
    from tests.fixtures.manager import make_manager

    nodes = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768,
              "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "A100", "memory_mib": 81920} for i in range(2)]}]
    m = make_manager(nodes, {"A100": 2}, f"sqlite:///{tmp_path / 'l.sqlite'}")
    spawner = GPUPoolLocalProcessSpawner(config=Config(), user=SimpleNamespace(name=ALICE))
    share = m.views.allocation_json(m.admission.admit(ALICE, [], "", parse_request({"gpu_fraction": 0.25})))
    env = spawner.gpupool_env(share)
    assert env["CUDA_VISIBLE_DEVICES"] == share["gpus"][0]["uuid"]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M" and env["GPUPOOL_GPU_MEMORY_LIMIT_MIB"] == "20480"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    whole = m.views.allocation_json(m.admission.admit(BOB, [], "", parse_request({"gpus": 1})))
    env = spawner.gpupool_env(whole)
    assert not {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "XLA_PYTHON_CLIENT_MEM_FRACTION", "GPUPOOL_GPU_FRACTION"} & set(env)
    m.close()
