"""Issue 27.2: GPU processes out of bounds, with the real agent against the real service.

Real processes under real (test) accounts stand for CUDA processes; the fake
NVML lists them on the GPUs the test says. A process whose owner holds no
allocation on its GPU, a kernel of a running server included, is warned about
(audited by the service), then stopped after ``boundary_grace``; the GPU's
holder is left alone, and root is reported, never signalled.
"""

from __future__ import annotations

from gpupool_hub.agent.attribution import GpuProcess, Snapshot
from gpupool_hub.agent.boundary import out_of_bounds
from gpupool_hub.agent.enforce import KILLED, SKIPPED_ROOT, TERMINATED, WOULD_TERMINATE
from gpupool_hub.reasons import AuditAction
from gpupool_hub.service.core.admission import parse_request
from tests.agent.conftest import alive
from tests.agent.test_memguard import tick_until
from tests.agent.test_service import TOKENS, Service, make_agent, two_gpus

ALICE, BOB = "gpupool-t1", "gpupool-t2"
GPUS = ("GPU-0000-fake", "GPU-0001-fake")


def layout(**on_gpu):
    """Fake NVML rows: GPU UUID -> pids on it."""
    return two_gpus(*(on_gpu.get(u, ()) for u in GPUS))


def audit(svc, user):
    return [(e.action, e.detail.get("pid")) for e in reversed(svc.manager.ledger.audit.page(user=user))]


async def test_a_kernel_on_a_gpu_its_user_does_not_hold_is_warned_then_stopped(tmp_path, procs, test_users, make_nvml):
    svc = Service(tmp_path)
    try:
        record = svc.manager.admission.admit(ALICE, [], "", parse_request({"gpus": 1}))
        mine = record.gpus[0]["uuid"]
        other = next(u for u in GPUS if u != mine)
        holder = procs.sleeper(ALICE)                   # alice on her own GPU
        server, kernel = procs.server_with_kernel(BOB)  # bob's running server: its kernel on alice's GPU
        stubborn = procs.sleeper(BOB, ignore_term=True)  # bob again, on the free GPU, ignoring SIGTERM
        root = procs.sleeper(None)                      # root on the free GPU
        nv = make_nvml(layout(**{mine: (holder.pid, kernel), other: (stubborn.pid, root.pid)}))
        agent = make_agent(nv, svc.url, boundary_grace=1.0)

        code, body = await svc.call("GET", "nodes/n1/boundary", TOKENS["n1"])
        assert code == 200 and body == {"holders": {mine: [ALICE]}, "dry_run": False}

        result = await agent.tick()
        found = {(w.found.user, w.found.gpu_uuid): sorted(p.pid for p in w.found.processes)
                 for w in result.boundary_warnings}
        assert found == {(BOB, mine): [kernel], (BOB, other): [stubborn.pid], ("root", other): [root.pid]}
        assert result.boundary_actions == [] and result.actions == []  # warned, nothing stopped yet
        warned = svc.manager.ledger.audit.page(user=BOB)
        assert {e.action for e in warned} == {AuditAction.GPU_OUT_OF_BOUNDS.value}
        assert any(f"process(es) {kernel} on GPU {mine}" in e.reason for e in warned)
        assert (await agent.tick()).boundary_actions == []  # the grace is not over, and no second warning
        assert len(svc.manager.ledger.audit.page(user=BOB)) == 2

        result = await tick_until(agent, lambda r: r.boundary_actions)
        assert {a.pid: a.action for a in result.boundary_actions} == {
            kernel: TERMINATED, stubborn.pid: KILLED, root.pid: SKIPPED_ROOT}
        assert not alive(kernel) and not alive(stubborn.pid)
        assert alive(holder.pid) and alive(root.pid) and alive(server.pid)  # the server itself holds no GPU
        stops = [(a, p) for a, p in audit(svc, BOB) if a == AuditAction.GPU_OUT_OF_BOUNDS_STOP.value]
        assert sorted(stops) == sorted([("gpu_out_of_bounds_stop", kernel), ("gpu_out_of_bounds_stop", stubborn.pid)])
        assert ("gpu_out_of_bounds_stop", root.pid) in audit(svc, "root")
        assert audit(svc, ALICE) == []

        # the processes are gone from NVML; root's refusal is not tried (nor audited) again
        nv.table["gpus"] = layout(**{mine: (holder.pid,), other: (root.pid,)})
        result = await agent.tick()
        assert [w.found.user for w in result.boundary_warnings] == ["root"] and result.boundary_actions == []
    finally:
        svc.stop()


async def test_a_process_whose_allocation_was_released_goes_out_of_bounds(tmp_path, procs, test_users, make_nvml):
    svc = Service(tmp_path)
    try:
        record = svc.manager.admission.admit(ALICE, [], "", parse_request({"gpus": 1}))
        mine = record.gpus[0]["uuid"]
        holder = procs.sleeper(ALICE)
        nv = make_nvml(layout(**{mine: (holder.pid,)}))
        agent = make_agent(nv, svc.url, boundary_grace=0.5)
        assert (await agent.tick()).boundary_warnings == []
        code, body = await svc.call("DELETE", f"allocations/{record.id}", "admin-token")
        assert code == 200, body
        result = await tick_until(agent, lambda r: r.boundary_actions)
        assert [(a.pid, a.action) for a in result.boundary_actions] == [(holder.pid, TERMINATED)]
        assert holder.wait(5) == -15
    finally:
        svc.stop()


async def test_dry_run_and_the_switch(tmp_path, procs, test_users, make_nvml):
    svc = Service(tmp_path, agent_dry_run=True)
    try:
        stray = procs.sleeper(BOB)
        nv = make_nvml(layout(**{GPUS[0]: (stray.pid,)}))
        agent = make_agent(nv, svc.url, boundary_grace=0.2)
        result = await tick_until(agent, lambda r: r.boundary_actions)
        assert [a.action for a in result.boundary_actions] == [WOULD_TERMINATE]
        assert (await agent.tick()).boundary_actions == []  # logged once per warning
        assert alive(stray.pid)
        assert all(e.dry_run for e in svc.manager.ledger.audit.page(user=BOB))
        off = make_agent(nv, svc.url, boundary_guard=False)
        assert (await off.tick()).boundary_warnings == []
    finally:
        svc.stop()


async def test_boundary_endpoints_check_their_input_and_token(tmp_path):
    svc = Service(tmp_path)
    try:
        ok = {"warnings": [{"user": BOB, "gpu_uuid": GPUS[0], "gpu_index": 0, "deadline": "2099-01-01T00:00:00Z",
                            "pids": [42]}], "actions": [], "dry_run": False}
        code, body = await svc.call("PUT", "nodes/n1/boundary", TOKENS["n1"], ok)
        assert code == 200 and body == {"node": "n1", "audited": 1}
        bad = {**ok, "warnings": [{**ok["warnings"][0], "gpu_uuid": "GPU-elsewhere"}]}
        code, body = await svc.call("PUT", "nodes/n1/boundary", TOKENS["n1"], bad)
        assert code == 400 and "not in node 'n1'" in body["message"]
        code, body = await svc.call("PUT", "nodes/n1/boundary", TOKENS["n1"], {**ok, "warnings": [{"user": 1}]})
        assert code == 400
        code, _ = await svc.call("GET", "nodes/n1/boundary", TOKENS["n2"])
        assert code == 403
        code, _ = await svc.call("GET", "nodes/n1/boundary", "user-token")
        assert code == 403
        code, body = await svc.call("GET", "nodes/n1/boundary", "admin-token")
        assert code == 200 and body["holders"] == {}
    finally:
        svc.stop()


def _p(pid, user, gpu, mig=None):
    return GpuProcess(pid=pid, gpu_index=int(gpu[-6]), gpu_uuid=gpu, model="A100", mig_uuid=mig, uid=1000, user=user)


def test_out_of_bounds_rules():
    snap = Snapshot(0.0, [], [
        _p(1, "a", GPUS[0]), _p(2, "b", GPUS[0]),            # a holds GPU 0, b shares nothing
        _p(3, "c", GPUS[1], mig="MIG-1"), _p(4, "d", GPUS[1], mig="MIG-2"),  # c holds MIG-1 only
        _p(5, None, GPUS[1]),                                 # unattributed: left out
    ])
    found = out_of_bounds(snap, {GPUS[0]: ["a"], "MIG-1": ["c"]})
    assert [(f.user, f.gpu_uuid, [p.pid for p in f.processes]) for f in found] == [
        ("b", GPUS[0], [2]), ("d", GPUS[1], [4])]
    # holding the whole GPU covers its instances
    assert out_of_bounds(snap, {GPUS[0]: ["a", "b"], GPUS[1]: ["d"], "MIG-1": ["c"]}) == []
