"""Agent <-> the real gpupool service (in-process tornado app, real PoolManager over SQLite)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from prometheus_client import generate_latest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpupool_hub.agent.app import GPUPoolAgent
from gpupool_hub.agent.enforce import SKIPPED_KERNEL, TERMINATED, WOULD_TERMINATE
from gpupool_hub.service.common.context import ServiceContext
from gpupool_hub.service.webapp import make_app
from tests.agent.conftest import A100, GIB, alive, gpu
from tests.fixtures.manager import make_manager
from tests.fixtures.ports import free_port

PREFIX = "/services/gpupool/"
ADMIN_SCOPE = "custom:gpupool:admin"
TOKENS = {"n1": "secret-n1", "n2": "secret-n2"}
NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768,
          "gpus": [{"index": 0, "uuid": "GPU-0000-fake", "model": A100},
                   {"index": 1, "uuid": "GPU-0001-fake", "model": A100}]}]


class StubHubAuth:
    """Stands in for HubAuth on the admin path: two known hub tokens."""

    async def user_for_token(self, token, sync=False):
        return {"admin-token": {"kind": "user", "name": "ada", "scopes": [ADMIN_SCOPE]},
                "user-token": {"kind": "user", "name": "bob", "scopes": []}}.get(token)


class Service:
    def __init__(self, tmp_path, clock=None, **settings):
        self.manager = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                                    **({"clock": clock} if clock is not None else {}))
        self.app = make_app(ServiceContext(manager=self.manager, hub_auth=StubHubAuth(), prefix=PREFIX,
                                           admin_scope=ADMIN_SCOPE, agent_tokens=dict(TOKENS), **settings))
        sock, self.port = bind_unused_port()
        self.server = HTTPServer(self.app)
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"

    async def call(self, method, path, token=None, body=None):
        headers = {"Authorization": f"token {token}"} if token else {}
        resp = await AsyncHTTPClient().fetch(
            self.url + "api/v1/" + path, method=method, headers=headers, raise_error=False,
            body=None if body is None else (body if isinstance(body, str) else json.dumps(body)))
        return resp.code, json.loads(resp.body or b"{}")

    def stop(self):
        self.server.stop()


@pytest.fixture
async def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


def make_agent(nv, url, node="n1", token=TOKENS["n1"], **kw) -> GPUPoolAgent:
    agent = GPUPoolAgent(nvml=nv, service_url=url, node_name=node, token=token,
                         min_uid=100, metrics_min_uid=100, grace=1.0, **kw)
    agent.setup()
    return agent


def two_gpus(*pids_per_gpu):
    return [gpu(i, processes=[{"pid": p, "memory": 1 << 20} for p in pids]) for i, pids in enumerate(pids_per_gpu)]


async def test_agent_reports_its_inventory_and_the_service_validates_and_stores_it(service, make_nvml):
    nv = make_nvml(two_gpus((), ()), topology={(0, 1): 10})
    agent = make_agent(nv, service.url, labels={"rack": "r1"})
    result = await agent.tick()
    assert result.nvml_ok and result.service_ok and result.inventory_reported
    report = service.manager.inventory.reports["n1"]
    assert report.inventory == result.inventory
    assert [g.uuid for g in report.node.gpus] == ["GPU-0000-fake", "GPU-0001-fake"]
    assert report.differences == []  # matches the configured pool
    assert report.last_seen is not None

    # unchanged hardware is not re-sent every tick, a change is sent at once
    assert (await agent.tick()).inventory_reported is False
    nv.table["gpus"].append(gpu(2))
    result = await agent.tick()
    assert result.inventory_reported
    assert service.manager.inventory.reports["n1"].differences == [f"GPU 2 ({A100}) is present but not configured"]

    code, body = await service.call("GET", "nodes/n1/inventory", "admin-token")
    assert code == 200 and len(body["inventory"]["gpus"]) == 3 and body["differences"]


@pytest.mark.parametrize("body,message", [
    ({"cpu_milli": 1000, "memory_mib": 1024, "gpus": [{"index": 0}]}, "inventory.gpus[0].model is missing"),
    ({"cpu_milli": 1000, "memory_mib": 1024, "gpus": [{"model": "A100"}],
      "links": [{"gpus": [0, 3], "nvlinks": 2}]}, "names GPU index 3"),
    ({"cpu_milli": 1000, "memory_mib": 1024, "bogus": 1}, "unknown key(s) 'bogus'"),
    ({"name": "n2", "cpu_milli": 1000, "memory_mib": 1024}, "names node 'n2' but was sent for 'n1'"),
    ("[1, 2]", "request body must be a JSON object"),
    ("{not json", "not valid JSON"),
])
async def test_a_bad_inventory_is_refused_with_a_message(service, body, message):
    code, answer = await service.call("PUT", "nodes/n1/inventory", TOKENS["n1"], body)
    assert code == 400 and message in answer["message"], answer
    assert "n1" not in service.manager.inventory.reports or \
        service.manager.inventory.reports["n1"].inventory is None


@pytest.mark.parametrize("token,status", [
    (None, 401), ("wrong", 401), ("user-token", 403),       # no token / unknown / a hub user without admin
    (TOKENS["n2"], 403),                                      # another node's agent token
    (TOKENS["n1"], 200), ("admin-token", 200),
])
async def test_agent_endpoints_need_the_nodes_token_or_admin(service, token, status):
    code, body = await service.call("GET", "nodes/n1/enforce", token)
    assert code == status, body
    if status == 200:
        assert body == {"users": [], "kernels": [], "allowed": {}, "dry_run": False, "report_inventory": True}
    else:
        assert body["status"] == status and body["message"]
    inv = {"cpu_milli": 1000, "memory_mib": 1024}
    assert (await service.call("PUT", "nodes/n1/inventory", token, inv))[0] == status


async def test_agent_stops_what_the_service_names(service, procs, test_users, make_nvml, server_records):
    t1 = procs.sleeper("gpupool-t1")
    t2 = procs.sleeper("gpupool-t2")
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)  # a server the hub started
    nv = make_nvml(two_gpus((t1.pid, t2.pid), (kernel,)))
    agent = make_agent(nv, service.url, server_record_dir=str(server_records))

    result = await agent.tick()  # nobody named yet
    assert result.enforce.users == frozenset() and result.actions == []

    service.manager.enforcement.users.add("gpupool-t1")
    result = await agent.tick()
    assert {a.pid: a.action for a in result.actions} == {t1.pid: TERMINATED, kernel: SKIPPED_KERNEL}
    t1.wait(5)
    assert alive(t2.pid) and alive(kernel)

    nv.table["gpus"][0]["processes"] = [{"pid": t2.pid}]
    service.manager.enforcement.kernel_users.add("gpupool-t1")  # the service says: kernels too
    result = await agent.tick()
    assert {a.pid: a.action for a in result.actions} == {kernel: TERMINATED}
    assert alive(t2.pid) and alive(server.pid)
    text = generate_latest(agent.metrics.registry).decode()
    assert 'gpupool_agent_enforcement_actions_total{action="terminated",user="gpupool-t1"} 2.0' in text


async def test_37_7_a_gpu_job_under_a_script_named_jupyter_lab_is_stopped_when_its_user_is_out_of_tokens(
        service, procs, test_users, make_nvml, server_records):
    """The out-of-tokens stop leaves the kernels of the server the hub started to the hub's culling;
    a GPU job whose parent merely calls itself ``jupyter-lab`` is the user's own process."""
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)  # recorded at spawn
    impostor, job = procs.server_with_kernel("gpupool-t1", program="jupyter-lab")  # started by the user
    nv = make_nvml(two_gpus((kernel,), (job,)))
    agent = make_agent(nv, service.url, server_record_dir=str(server_records))
    assert (await agent.tick()).actions == []  # nobody named: nothing stopped

    service.manager.enforcement.users.add("gpupool-t1")  # the cull job put the user on the list
    result = await agent.tick()
    assert {a.pid: a.action for a in result.actions} == {kernel: SKIPPED_KERNEL, job: TERMINATED}
    assert not alive(job) and alive(impostor.pid)  # the GPU job, not its parent (it holds no GPU)
    assert alive(kernel) and alive(server.pid)  # the hub's server and its kernel: the hub culls those


async def test_the_service_can_ask_for_a_dry_run(tmp_path, procs, make_nvml):
    svc = Service(tmp_path, agent_dry_run=True)
    try:
        p = procs.sleeper("gpupool-t1")
        svc.manager.enforcement.users.add("gpupool-t1")
        result = await make_agent(make_nvml(two_gpus((p.pid,), ())), svc.url).tick()
        assert result.enforce.dry_run and [a.action for a in result.actions] == [WOULD_TERMINATE]
        assert alive(p.pid)
    finally:
        svc.stop()


async def test_service_down_keeps_exporting_and_enforces_nothing(service, procs, make_nvml):
    p = procs.sleeper("gpupool-t1")
    nv = make_nvml(two_gpus((p.pid,), ()))
    agent = make_agent(nv, service.url, dry_run=False)
    assert (await agent.tick()).service_ok

    service.manager.enforcement.users.add("gpupool-t1")
    service.stop()  # the service goes away before the agent could learn the new list
    server = agent.metrics.serve(0, "127.0.0.1")
    try:
        result = await agent.tick()
        assert result.nvml_ok and result.service_ok is False and "Connection refused" in result.service_error
        assert result.actions == [] and alive(p.pid)
        body = await asyncio.get_running_loop().run_in_executor(
            None, lambda: urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read())
        text = body.decode()
        assert 'gpupool_agent_user_gpu_active{gpu_uuid="GPU-0000-fake",model="' + A100 + '",node="n1",user="gpupool-t1"} 1.0' in text
        assert "gpupool_agent_service_up 0.0" in text and "gpupool_agent_nvml_up 1.0" in text
    finally:
        server.shutdown()
        server.server_close()


async def test_the_loop_keeps_running_through_nvml_and_service_failures(make_nvml):
    dead_url = f"http://127.0.0.1:{free_port()}{PREFIX}"  # a port nobody listens on
    nv = make_nvml(two_gpus((), ()), init_error=12)  # NVML_ERROR_LIBRARY_NOT_FOUND at first
    agent = make_agent(nv, dead_url, interval=0.05, request_timeout=1)
    task = asyncio.create_task(agent.run())
    await asyncio.sleep(0.3)
    assert agent.metrics.nvml_up._value.get() == 0
    nv.table["init_error"] = None  # the driver comes back: the agent recovers by itself
    for _ in range(100):
        await asyncio.sleep(0.05)
        if agent.metrics.nvml_up._value.get() == 1:
            break
    assert agent.metrics.nvml_up._value.get() == 1 and agent.metrics.service_up._value.get() == 0
    agent.stop()
    await asyncio.wait_for(task, 5)
    assert not task.exception() and nv.initialized == 0


async def test_18_7_stray_kernel_on_a_gpu_the_user_no_longer_holds_is_stopped(service, procs, make_nvml):
    from gpupool_hub.service.core.admission import parse_request

    record = service.manager.admission.admit("gpupool-t1", [], "", parse_request({"gpus": 1}))
    mine = record.gpus[0]["uuid"]
    kept = procs.sleeper("gpupool-t1")  # on the GPU the user still holds
    server, kernel = procs.server_with_kernel("gpupool-t1")  # a new kernel on the other GPU
    on_mine, on_other = ((kept.pid,), (kernel,)) if mine == "GPU-0000-fake" else ((kernel,), (kept.pid,))
    nv = make_nvml(two_gpus(on_mine, on_other))
    agent = make_agent(nv, service.url)
    assert (await agent.tick()).actions == []  # nothing revoked: the kernel is left alone
    # the user's kernels were culled (their GPUs went to someone else); pressure is over,
    # the user is on no list, but the server runs on with a stale CUDA_VISIBLE_DEVICES
    service.manager.enforcement.revoked[("gpupool-t1", "")] = service.manager.clock()
    code, body = await service.call("GET", "nodes/n1/enforce", TOKENS["n1"])
    assert code == 200 and body["allowed"] == {"gpupool-t1": [mine]} and body["users"] == []
    result = await agent.tick()
    assert {a.pid: a.action for a in result.actions} == {kernel: TERMINATED}
    assert alive(kept.pid) and alive(server.pid)


async def test_agent_reports_utilization_and_memory_for_idle_reclaim(tmp_path, make_nvml):
    """Without Prometheus the service learns utilization from the agents: what the idle
    rule and the lab widget read. A service that reads Prometheus answers 409 once."""
    from gpupool_hub.usage.utilization import ReportedUtilization

    source = ReportedUtilization(0.05)
    service = Service(tmp_path, utilization=source)
    try:
        nv = make_nvml([gpu(0, utilization=0), gpu(1, utilization=73)])
        agent = make_agent(nv, service.url)
        result = await agent.tick()
        assert result.service_ok, result.service_error
        got = await source.readings(["GPU-0000-fake", "GPU-0001-fake"], 3600)
        assert {u: (r.utilization, r.memory_used_bytes, r.memory_total_bytes) for u, r in got.items()} == {
            "GPU-0000-fake": (0.0, 2 * GIB, 80 * GIB), "GPU-0001-fake": (0.73, 2 * GIB, 80 * GIB)}
        assert got["GPU-0000-fake"].idle_since is not None and got["GPU-0001-fake"].idle_since is None
    finally:
        service.stop()

    (tmp_path / "prom").mkdir()
    prom = Service(tmp_path / "prom")  # utilization=None: the service reads Prometheus
    try:
        agent = make_agent(make_nvml([gpu(0)]), prom.url)
        assert (await agent.tick()).service_ok
        assert agent.metrics.loop_errors.labels("utilization")._value.get() == 0  # a 409 is no error
    finally:
        prom.stop()
