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
from gpupool_hub.placement.inventory import MigDevice
from gpupool_hub.service.context import ServiceContext
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

    def __init__(self, manager) -> None:
        self.manager = manager
        app = make_app(ServiceContext(manager=manager, hub_auth=StubHubAuth(), prefix=PREFIX,
                                      admin_scope=ADMIN_SCOPE, agent_tokens=dict(TOKENS)))
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

        for node, nv in machines(make_nvml).items():
            result = await agent_for(nv, discovered.url, node).tick()
            assert result.service_ok and result.inventory_reported, result.service_error
        assert await discovered.pool() == await configured.pool()
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
