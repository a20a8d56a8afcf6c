"""``c.GPUPool.inventory = "agents"``: the pool is what the node agents report.

Two fake-NVML machines (``tests/agent/fake_pynvml.py``) run the agent's own
report code against the service: in process (a real ``PoolManager`` over
SQLite behind the real tornado app) for the pool they build, and through a
real JupyterHub with the service as its managed process for a node whose agent
goes silent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpupool_hub.inventory.agents import AgentInventory
from gpupool_hub.placement.hardware import MigDevice
from gpupool_hub.profiles import parse_profiles
from gpupool_hub.service.common.context import ServiceContext
from gpupool_hub.service.webapp import make_app
from tests.agent.conftest import A100, GIB, gpu
from tests.agent.fake_pynvml import NVML_TOPOLOGY_NODE, NVML_TOPOLOGY_SINGLE
from tests.agent.test_service import ADMIN_SCOPE, PREFIX, StubHubAuth, make_agent
from tests.fixtures.manager import Clock, make_manager

TOKENS = {"n1": "secret-n1", "n2": "secret-n2"}
PRICES = {"A100": 2}
CPU, MEM = 32000, 131072


def bus(node: int, i: int) -> str:
    return f"0000000{node}:{0x10 + i:02X}:00.0"


def n1_machine() -> dict:
    """Four A100s, NVLink (4 links) and one PCIe switch between 0-1 and between 2-3."""
    gpus = [gpu(i, uuid=f"GPU-n1-{i}", bus_id=bus(1, i)) for i in range(4)]
    gpus[0]["nvlinks"] = {link: bus(1, 1) for link in range(4)}
    gpus[2]["nvlinks"] = {link: bus(1, 3) for link in range(4)}
    return {"gpus": gpus, "topology": {(0, 1): NVML_TOPOLOGY_SINGLE, (2, 3): NVML_TOPOLOGY_SINGLE}}


def n2_machine() -> dict:
    """Two A100s on one NUMA node; GPU 0 in MIG mode (3g.40gb, 3g.40gb, 1g.10gb)."""
    mig = [{"uuid": f"MIG-n2-0{c}", "name": f"{A100} MIG {p}", "gi_id": gi, "slices": int(p[0]),
            "memory_total": int(p.split(".")[1][:-2]) * GIB} for c, p, gi in
           (("a", "3g.40gb", 1), ("b", "3g.40gb", 2), ("c", "1g.10gb", 9))]
    return {"gpus": [gpu(0, uuid="GPU-n2-0", bus_id=bus(2, 0), mig=mig), gpu(1, uuid="GPU-n2-1", bus_id=bus(2, 1))],
            "topology": {(0, 1): NVML_TOPOLOGY_NODE}}


# The same two machines as an admin types them (what `gpupool-agent --once` prints)
SYSTEM = "SYSTEM"
CONFIG_NODES = [
    {"name": "n1", "cpu_milli": CPU, "memory_mib": MEM, "labels": {"rack": "r1"},
     "gpus": [{"index": i, "uuid": f"GPU-n1-{i}", "model": A100, "memory_mib": 81920} for i in range(4)],
     "links": [{"gpus": [0, 1], "nvlinks": 4, "pcie": "SINGLE"}, {"gpus": [0, 2], "pcie": SYSTEM},
               {"gpus": [0, 3], "pcie": SYSTEM}, {"gpus": [1, 2], "pcie": SYSTEM}, {"gpus": [1, 3], "pcie": SYSTEM},
               {"gpus": [2, 3], "nvlinks": 4, "pcie": "SINGLE"}]},
    {"name": "n2", "cpu_milli": CPU, "memory_mib": MEM, "labels": {"rack": "r2"},
     "gpus": [{"index": 0, "uuid": "GPU-n2-0", "model": A100, "memory_mib": 81920,
               "mig": [{"uuid": "MIG-n2-0a", "profile": "3g.40gb"}, {"uuid": "MIG-n2-0b", "profile": "3g.40gb"},
                       {"uuid": "MIG-n2-0c", "profile": "1g.10gb"}]},
              {"index": 1, "uuid": "GPU-n2-1", "model": A100, "memory_mib": 81920}],
     "links": [{"gpus": [0, 1], "pcie": "NODE"}]},
]


class Service:
    """The service's real app and core in this process, on a port of its own."""

    def __init__(self, manager, **settings) -> None:
        self.manager = manager
        app = make_app(ServiceContext(manager=manager, hub_auth=StubHubAuth(), prefix=PREFIX,
                                      admin_scope=ADMIN_SCOPE, agent_tokens=dict(TOKENS), **settings))
        sock, port = bind_unused_port()
        self.server = HTTPServer(app)
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{port}{PREFIX}"

    async def call(self, method, path, token="admin-token", body=None):
        resp = await AsyncHTTPClient().fetch(
            self.url + "api/v1/" + path, method=method, raise_error=False,
            headers={"Authorization": f"token {token}"},
            body=None if body is None else (body if isinstance(body, str) else json.dumps(body)))
        return resp.code, json.loads(resp.body or b"{}")

    async def allocate(self, user: str, request: dict):
        return await self.call("POST", "allocations", body={"user": user, "server": "", "groups": [],
                                                            "request": request})

    async def pool(self) -> list[dict]:
        code, body = await self.call("GET", "pool")
        assert code == 200, body
        return body["nodes"]


def agents_manager(db: str, clock: Clock, timeout: float = 90):
    return make_manager([], PRICES, db, clock=clock, inventory="agents",
                        source=AgentInventory(timeout, clock=clock))


def machines(make_nvml) -> dict:
    return {"n1": make_nvml(**n1_machine()), "n2": make_nvml(**n2_machine())}


def agent_for(nv, url: str, node: str):
    return make_agent(nv, url, node=node, token=TOKENS[node], cpu_milli=CPU, memory_mib=MEM,
                      labels={"rack": {"n1": "r1", "n2": "r2"}[node]})


def by_holder(nodes: list[dict], ids: dict[str, str]) -> list[dict]:
    """GET pool's nodes with allocation ids replaced by names (ids are random per service)."""
    return json.loads(re.sub("|".join(map(re.escape, ids)) or "^$", lambda m: ids[m.group(0)], json.dumps(nodes)))


@pytest.fixture
def make_nvml():  # tables with the machine's topology; the conftest's takes (gpus, **table)
    from tests.agent import fake_pynvml

    return lambda **table: fake_pynvml.load(table)


async def test_two_agents_build_the_same_pool_as_the_config_list(tmp_path, make_nvml):
    clock = Clock()
    configured = Service(make_manager(CONFIG_NODES, PRICES, f"sqlite:///{tmp_path / 'config.sqlite'}", clock=clock))
    discovered = Service(agents_manager(f"sqlite:///{tmp_path / 'agents.sqlite'}", clock))
    try:
        assert await discovered.pool() == []  # nothing until an agent reports
        code, body = await discovered.allocate("ann", {"gpus": 1})
        assert code == 409 and body["reason"] == "model_unavailable", body
        # a configured 4-GPU profile (issue 18.1): nothing to keep room for on no node, yet no error
        quad = parse_profiles([{"slug": "quad", "display_name": "4 x A100", "gpus": 4}])
        assert discovered.manager.inventory.expect_profiles(quad) == []

        for node, nv in machines(make_nvml).items():
            result = await agent_for(nv, discovered.url, node).tick()
            assert result.service_ok and result.inventory_reported, result.service_error
        assert await discovered.pool() == await configured.pool()
        # the pool rebuilt for the reported nodes keeps room for the profile's shape again
        assert [key[2] for key in discovered.manager.pool.policy.mix.expected] == [4]
        # the placement pool itself: GPUs, memory, labels, NVLink/PCIe links and MIG instances
        assert [ns.node for ns in discovered.manager.pool.nodes] == [ns.node for ns in configured.manager.pool.nodes]
        assert discovered.manager.pool.by_name["n2"].node.gpus[0].mig == (
            MigDevice("MIG-n2-0a", "3g.40gb", 428), MigDevice("MIG-n2-0b", "3g.40gb", 428),
            MigDevice("MIG-n2-0c", "1g.10gb", 142))

        # both place the same requests on the same devices: the links and MIG instances count
        ids: dict[str, str] = {}
        for who, request in [("pair", {"gpus": 2}), ("pair2", {"gpus": 2}), ("slice", {"gpu_fraction": 0.1}),
                             ("half", {"gpu_fraction": 0.4})]:
            answers = []
            for service in (configured, discovered):
                code, body = await service.allocate(who, request)
                assert code == 201, body
                ids[body["allocation"]["id"]] = who
                answers.append({k: body["allocation"][k] for k in ("node", "gpus")})
            assert answers[0] == answers[1], who
            if who == "pair":
                assert {g["uuid"] for g in answers[0]["gpus"]} in ({"GPU-n1-0", "GPU-n1-1"}, {"GPU-n1-2", "GPU-n1-3"})
        assert by_holder(await discovered.pool(), ids) == by_holder(await configured.pool(), ids)
        n2 = next(n for n in await discovered.pool() if n["node"] == "n2")
        assert [(m["uuid"], m["profile"]) for m in n2["gpus"][0]["mig"]] == [
            ("MIG-n2-0a", "3g.40gb"), ("MIG-n2-0b", "3g.40gb"), ("MIG-n2-0c", "1g.10gb")]
    finally:
        configured.server.stop()
        discovered.server.stop()


async def test_bad_reports_change_nothing_and_a_restart_keeps_allocations_until_the_node_reports(tmp_path, make_nvml):
    clock = Clock()
    db = f"sqlite:///{tmp_path / 'agents.sqlite'}"
    service = Service(agents_manager(db, clock))
    nv = machines(make_nvml)
    agents = {node: agent_for(nv[node], service.url, node) for node in nv}
    try:
        for agent in agents.values():
            assert (await agent.tick()).inventory_reported
        code, body = await service.allocate("ann", {"gpus": 2})
        assert code == 201 and body["allocation"]["node"] == "n1", body
        held = body["allocation"]
        before = await service.pool()
        n2_report = service.manager.inventory.reports["n2"].inventory

        good = dict(n2_report)
        clash = {**good, "gpus": [good["gpus"][0], {**good["gpus"][1], "uuid": "GPU-n1-0"}]}
        unpriced = {**good, "gpus": [good["gpus"][0], {**good["gpus"][1], "model": "Tesla V100-PCIE-16GB"}]}
        for token, body, status, message in [
            (TOKENS["n2"], clash, 403, "device GPU-n1-0 of GPU 1 is already reported by node 'n1'"),
            (TOKENS["n2"], unpriced, 400, "'Tesla V100-PCIE-16GB' in the pool have no price"),
            (TOKENS["n2"], {**good, "gpus": [{"index": 0}], "links": []}, 400, "inventory.gpus[0].model is missing"),
            (TOKENS["n2"], "{not json", 400, "not valid JSON"),
            (TOKENS["n1"], good, 403, "belongs to node 'n1', not 'n2'"),
            ("wrong", good, 401, "invalid or expired token"),
        ]:
            code, answer = await service.call("PUT", "nodes/n2/inventory", token, body)
            assert code == status and message in answer["message"], answer
        assert await service.pool() == before  # nothing lost, nothing half-applied
        assert service.manager.inventory.reports["n2"].inventory == n2_report
    finally:
        service.server.stop()

    # the service restarts: no node is known until its agent reports, the allocation stays held
    restarted = Service(agents_manager(db, clock))
    try:
        assert restarted.manager.restore() == 0
        assert await restarted.pool() == []
        code, body = await restarted.call("GET", "allocations")
        assert [a["id"] for a in body["allocations"]] == [held["id"]]
        code, body = await restarted.call("GET", "nodes/n1/enforce", TOKENS["n1"])
        assert code == 200 and body["report_inventory"] is True
        for agent in agents.values():  # unchanged hardware, but the service asked for it
            agent.client.api = agent.client.api.replace(service.url, restarted.url)
            assert (await agent.tick()).inventory_reported
            assert (await agent.tick()).inventory_reported is False  # asked once, sent once
        n1 = next(n for n in await restarted.pool() if n["node"] == "n1")
        holders = {g["uuid"]: [h["allocation"] for h in g["holders"]] for g in n1["gpus"]}
        assert {u for u, h in holders.items() if h == [held["id"]]} == {g["uuid"] for g in held["gpus"]}
        code, body = await restarted.allocate("bea", {"gpus": 2})  # the other NVLink pair of n1
        assert code == 201 and body["allocation"]["node"] == "n1", body
        assert not {g["uuid"] for g in body["allocation"]["gpus"]} & {g["uuid"] for g in held["gpus"]}
    finally:
        restarted.server.stop()


async def test_after_a_restart_one_nodes_token_cannot_claim_another_nodes_gpus(tmp_path, make_nvml):
    """Issue 27.12: the service restarts; n2's token sends n1's GPUs before n1 reported
    again. Refused (403), as is n2's token reporting n1's utilization; n1's own report
    then succeeds. An admin may still move a device whose node is gone."""
    clock = Clock()
    db = f"sqlite:///{tmp_path / 'agents.sqlite'}"
    service = Service(agents_manager(db, clock))
    nv = machines(make_nvml)
    agents = {node: agent_for(nv[node], service.url, node) for node in nv}
    try:
        for agent in agents.values():
            assert (await agent.tick()).inventory_reported
        n1_report = service.manager.inventory.reports["n1"].inventory
    finally:
        service.server.stop()

    restarted = Service(agents_manager(db, clock))
    try:
        restarted.manager.restore()
        n1_as_n2 = {**n1_report, "name": "n2"}
        code, answer = await restarted.call("PUT", "nodes/n2/inventory", TOKENS["n2"], n1_as_n2)
        assert code == 403, answer
        assert answer["message"].startswith("invalid inventory: device GPU-n1-0 of GPU 0 belongs to node 'n1'")
        assert "n2" not in restarted.manager.inventory.reports or \
            restarted.manager.inventory.reports["n2"].inventory is None
        # n1 reports: its own GPUs are its own
        code, answer = await restarted.call("PUT", "nodes/n1/inventory", TOKENS["n1"], n1_report)
        assert code == 200 and answer["accepted"], answer
        # n2's token now sends n1's GPUs (n1 reporting live) or n1's utilization: 403 again
        code, answer = await restarted.call("PUT", "nodes/n2/inventory", TOKENS["n2"], n1_as_n2)
        assert code == 403 and "already reported by node 'n1'" in answer["message"], answer
        code, answer = await restarted.call("PUT", "nodes/n2/inventory", "admin-token", n1_as_n2)
        assert code == 400 and "already reported by node 'n1'" in answer["message"], answer  # not even an admin
        assert sorted(n["node"] for n in await restarted.pool()) == ["n1"]
    finally:
        restarted.server.stop()

    # n1 is gone for good and its GPUs moved to n2: after another restart only an admin may move them
    again = Service(agents_manager(db, clock))
    try:
        again.manager.restore()
        code, answer = await again.call("PUT", "nodes/n2/inventory", TOKENS["n2"], n1_as_n2)
        assert code == 403, answer
        code, answer = await again.call("PUT", "nodes/n2/inventory", "admin-token", n1_as_n2)
        assert code == 200, answer
        code, answer = await again.call("PUT", "nodes/n1/inventory", TOKENS["n1"], n1_report)
        assert code == 403 and "already reported by node 'n2'" in answer["message"], answer
    finally:
        again.server.stop()


async def test_utilization_and_memory_reports_of_another_nodes_gpus_are_forbidden(tmp_path, make_nvml):
    clock = Clock()
    db = f"sqlite:///{tmp_path / 'agents.sqlite'}"
    from gpupool_hub.usage.utilization import ReportedUtilization

    manager = agents_manager(db, clock)
    manager.restore()
    app_utilization = ReportedUtilization(0.1)
    service = Service(manager, utilization=app_utilization)
    nv = machines(make_nvml)
    try:
        for node in nv:
            assert (await agent_for(nv[node], service.url, node).tick()).inventory_reported
        for path, body in [("utilization", {"gpus": {"GPU-n1-0": 0.5}}),
                           ("memory", {"warnings": [], "actions": [
                               {"user": "ann", "server": "", "gpu_uuid": "GPU-n1-0", "pid": 7, "memory_bytes": 1,
                                "action": "terminated", "detail": ""}]})]:
            code, answer = await service.call("PUT", f"nodes/n2/{path}", TOKENS["n2"], body)
            assert code == 403 and answer["message"] == "GPU GPU-n1-0 belongs to node 'n1', not 'n2'", (path, answer)
            code, answer = await service.call("PUT", f"nodes/n2/{path}", TOKENS["n2"],
                                              json.loads(json.dumps(body).replace("GPU-n1-0", "GPU-nowhere")))
            assert code == 400 and "not in node 'n2'" in answer["message"], (path, answer)
        code, answer = await service.call("PUT", "nodes/n1/utilization", TOKENS["n1"], {"gpus": {"GPU-n1-0": 0.5}})
        assert code == 200, answer
    finally:
        service.server.stop()


A6000 = "NVIDIA RTX A6000"


async def test_a_silent_node_takes_no_new_placements_keeps_its_servers_and_rejoins(hub_factory, make_nvml):
    """Through a real hub and its managed service: n2's agent stops calling, so after
    ``agent_timeout`` n2 takes no new server; ann's allocation there stays; n2 is back
    once its agent calls again."""
    import requests

    from tests.fixtures.hub import wait_for

    hub = hub_factory(f"""
c.GPUPool.inventory = "agents"
c.GPUPool.agent_timeout = 2
c.GPUPool.queue_enabled = False  # the test reads the refusal that names the silent node (no_capacity)
c.GPUPool.prices = {{"A100": 2, "RTX A6000": 4}}
c.GPUPoolService.agent_tokens = {TOKENS!r}
""")
    url = f"{hub.url}/services/gpupool/"
    n2 = {"gpus": [gpu(i, model=A6000, uuid=f"GPU-n2-{i}", bus_id=bus(2, i)) for i in range(2)]}
    agents = {"n1": agent_for(make_nvml(**n1_machine()), url, "n1"), "n2": agent_for(make_nvml(**n2), url, "n2")}
    for agent in agents.values():
        agent.interval = 0.3
    runs = {node: asyncio.create_task(agent.run()) for node, agent in agents.items()}

    def pool() -> dict[str, dict]:
        r = hub.service("GET", "/pool", hub.tester_token)
        assert r.status_code == 200, r.text
        return {n["node"]: n for n in r.json()["nodes"]}

    def allocate(user: str, request: dict) -> requests.Response:
        return hub.service("POST", "/allocations", hub.spawner_token,
                           json={"user": user, "server": "", "groups": [], "request": request})

    async def until(check, what: str, timeout: float = 20):  # the agents tick on this loop meanwhile
        return await asyncio.to_thread(wait_for, check, timeout, what)

    a6000 = {"gpus": 1, "models": ["RTX A6000"]}
    try:
        await until(lambda: sorted(pool()) == ["n1", "n2"], "both nodes to join")
        r = allocate("ann", a6000)
        assert r.status_code == 201 and r.json()["allocation"]["node"] == "n2", r.text
        ann = r.json()["allocation"]

        agents["n2"].stop()  # n2's agent goes silent
        await runs["n2"]
        silent_at = time.monotonic()
        why = await until(lambda: pool()["n2"].get("unavailable"), "n2 to be marked unavailable")
        assert "its node agent has not reported for" in why
        assert time.monotonic() - silent_at < 2 + 1 + 5  # agent_timeout + one refresh + slack

        r = allocate("bob", a6000)  # only n2 has A6000s: refused, saying why
        assert r.status_code == 409 and r.json()["reason"] == "no_capacity", r.text
        assert "node n2 (its node agent has not reported for" in r.json()["message"]
        r = allocate("cy", {"gpus": 1})  # any model: goes to the other node
        assert r.status_code == 201 and r.json()["allocation"]["node"] == "n1", r.text
        held = [h["allocation"] for g in pool()["n2"]["gpus"] for h in g["holders"] if not h.get("held_outside")]
        assert held == [ann["id"]]
        assert hub.service("GET", f"/allocations/{ann['id']}", hub.spawner_token).json()["allocation"][
            "released_at"] is None

        runs["n2"] = asyncio.create_task(agents["n2"].run())  # the agent calls again
        await until(lambda: "unavailable" not in pool()["n2"], "n2 to rejoin")
        r = allocate("bob", a6000)
        assert r.status_code == 201 and r.json()["allocation"]["node"] == "n2", r.text
    finally:
        for agent in agents.values():
            agent.stop()
        await asyncio.gather(*runs.values())
