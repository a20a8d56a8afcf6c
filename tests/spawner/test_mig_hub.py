"""MIG profiles end to end through a real hub (issue 16.1).

A node with two MIG-mode A100s: GPU 0 split into 7 × 1g.10gb, GPU 1 into
2 × 3g.40gb + 1 × 1g.10gb. The scenario runs twice: with the node declared in
``c.GPUPool.nodes``, and with ``c.GPUPool.inventory = "agents"``, where the
node agent finds the same layout in a fake NVML (``tests/agent/fake_pynvml.py``)
and reports it, so the instances come from discovery. Profiles ask for one
1g or one 3g instance. A100s cost 2.8 tokens/h, so a 1g instance costs 2.8/7 =
0.4 tokens/h by its slices; 3g.40gb has its own price (1.5) in
``c.GPUPool.mig_prices``. The test spawns both profiles and checks what a user
and an admin notice: the spawn form's prices, the instance UUID in the
server's CUDA_VISIBLE_DEVICES, the price in the ledger and a debit of exact
milli-tokens, and the instances inside their GPU in ``GET pool``, ``gpupool
pool`` and the admin pool map.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest

from tests.fixtures.hub import wait_for
from tests.spawner.conftest import POOL, PROFILES, spawner_hub, start_ok, stop_server

A100 = "NVIDIA A100-SXM4-80GB"
MIG_NODE = {
    "name": "node-mig", "cpu_milli": 32000, "memory_mib": 131072,
    "gpus": [
        {"index": 0, "uuid": "GPU-a100-0", "model": A100, "memory_mib": 81920,
         "mig": [{"uuid": f"MIG-0-1g-{i}", "profile": "1g.10gb"} for i in range(7)]},
        {"index": 1, "uuid": "GPU-a100-1", "model": A100, "memory_mib": 81920,
         "mig": [{"uuid": "MIG-1-3g-0", "profile": "3g.40gb"}, {"uuid": "MIG-1-3g-1", "profile": "3g.40gb"},
                 {"uuid": "MIG-1-1g-0", "profile": "1g.10gb"}]},
    ],
}
MIG_PROFILES = [
    {"slug": "a100-1g", "display_name": "A100 1g.10gb", "mig": "1g.10gb", "models": ["A100"]},
    {"slug": "a100-3g", "display_name": "A100 3g.40gb", "mig": "3g.40gb", "models": ["A100"]},
]
AGENT_TOKEN = "secret-node-mig"


def fake_nvml_machine():
    """MIG_NODE as the fake NVML shows it to the node agent (profiles only in the MIG devices' names)."""
    from tests.agent import fake_pynvml

    def instance(m: dict, gi: int) -> dict:
        profile = m["profile"]
        return {"uuid": m["uuid"], "name": f"{A100} MIG {profile}", "gi_id": gi, "slices": int(profile[0]),
                "memory_total": int(profile.split(".")[1][:-2]) << 30}

    return fake_pynvml.load({"gpus": [
        {"uuid": g["uuid"], "name": A100, "memory_total": 80 << 30, "memory_used": 0, "utilization": 0,
         "bus_id": f"00000000:{0x10 + g['index']:02X}:00.0", "processes": [],
         "mig": [instance(m, gi) for gi, m in enumerate(g["mig"], 1)]} for g in MIG_NODE["gpus"]]})


def report_from_agent(hub) -> None:
    """One tick of the node agent: it reports the node's inventory to the hub's service."""
    from gpupool_hub.agent.app import GPUPoolAgent

    agent = GPUPoolAgent(nvml=fake_nvml_machine(), service_url=f"{hub.url}/services/gpupool/",
                         node_name="node-mig", token=AGENT_TOKEN, cpu_milli=MIG_NODE["cpu_milli"],
                         memory_mib=MIG_NODE["memory_mib"], min_uid=100, metrics_min_uid=100)
    agent.setup()
    result = asyncio.run(agent.tick())
    assert result.service_ok and result.inventory_reported, result.service_error


@pytest.fixture(scope="module", params=["config", "agents"])
def hub(request, tmp_path_factory):
    if request.param == "config":
        inventory = f"c.GPUPool.nodes = {json.dumps(POOL + [MIG_NODE])}"
    else:
        inventory = f'c.GPUPool.inventory = "agents"\nc.GPUPoolService.agent_tokens = {{"node-mig": {AGENT_TOKEN!r}}}'
    extra = f"""
{inventory}
c.GPUPool.prices = {{"RTX 3090": 1, "RTX A6000": 4, "A100": "2.8"}}
c.GPUPool.mig_prices = {{"3g.40gb": "1.5"}}
c.GPUPoolSpawner.profiles = {PROFILES + MIG_PROFILES!r}
for _service in c.JupyterHub.services:  # the pages log admins in as the example config does
    if _service["name"] == "gpupool":
        _service.update(oauth_no_confirm=True, oauth_client_allowed_scopes=["custom:gpupool:admin"])
"""
    hubs = spawner_hub(tmp_path_factory, f"mighub-{request.param}", extra)
    hub = next(hubs)
    try:
        if request.param == "agents":
            report_from_agent(hub)
            wait_for(lambda: "node-mig" in {n["node"] for n in hub.service("GET", "/pool", hub.tester_token).json()[
                "nodes"]}, 20, "the agent's node to join the pool")
        yield hub
    finally:
        hubs.close()  # stops the servers and the hub

def _form_block(hub, user: str, slug: str) -> str:
    page = hub.login(user).get(f"{hub.url}/hub/spawn", timeout=30)
    assert page.status_code == 200, page.text[:300]
    m = re.search(rf'<div class="[^"]*" data-profile="{re.escape(slug)}".*?(?=<div class="gpupool-profile|\Z)',
                  page.text, re.S)
    assert m, f"no profile {slug!r} in the form"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(0)))


def _pool_gpus(hub) -> dict[str, dict]:
    r = hub.service("GET", "/pool", hub.tester_token)
    assert r.status_code == 200, r.text
    node = next(n for n in r.json()["nodes"] if n["node"] == "node-mig")
    return {g["uuid"]: g for g in node["gpus"]}


def test_mig_profiles_end_to_end(hub, monkeypatch, capsys):
    # the spawn form prices each profile by its instance: 1g by slices (2.8 / 7), 3g from mig_prices
    one_g = _form_block(hub, "carol", "a100-1g")
    assert "Price: 0.4 tokens/h." in one_g and "One 1g.10gb MIG instance" in one_g
    assert "8 of 8 1g.10gb instances free" in one_g
    assert "Price: 1.5 tokens/h." in _form_block(hub, "carol", "a100-3g")

    # placement: the lone 1g of the mixed GPU first (GPU 0 keeps its seven 1g's together),
    # then the 3g on that same GPU, already in use, rather than breaking into a fresh one
    alice = start_ok(hub, "alice", {"profile": "a100-1g"})
    bob = start_ok(hub, "bob", {"profile": "a100-3g"}, "big")
    assert alice["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-1-1g-0"
    assert alice["env"]["NVIDIA_VISIBLE_DEVICES"] == "MIG-1-1g-0"
    assert bob["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-1-3g-0"
    assert alice["env"]["GPUPOOL_NODE"] == bob["env"]["GPUPOOL_NODE"] == "node-mig"

    # the ledger: price per hour by instance, the instance and its profile in the allocation
    r = hub.service("GET", "/allocations", hub.spawner_token)
    held = {a["user"]: a for a in r.json()["allocations"]}
    assert held["alice"]["price_per_hour"] == "0.400"
    assert held["bob"]["price_per_hour"] == "1.500"
    assert held["alice"]["gpus"] == [{"index": 1, "uuid": "GPU-a100-1", "model": A100, "fraction": "0.142",
                                      "memory_mib": 81920, "mig_uuid": "MIG-1-1g-0", "mig_profile": "1g.10gb"}]

    # a debit of one hour of each allocation, from the service's own records: exact milli-tokens
    from gpupool_hub.ledger import Ledger
    from gpupool_hub.money.pricing import PriceTable
    from gpupool_hub.service.core.debits import Debits
    from gpupool_hub.usage.own_records import AllocationRecordsSource

    ledger = Ledger(f"sqlite:///{hub.workdir}/gpupool.sqlite")
    try:
        records = {r.user: r for r in ledger.allocations.active()}
        start = max(records["alice"].created_at, records["bob"].created_at)
        prices = PriceTable.from_config({"A100": "2.8"}, mig_prices={"3g.40gb": "1.5"})
        debits = Debits(ledger, prices, AllocationRecordsSource(ledger), interval=3600, delay_tolerance=0,
                        clock=lambda: start)
        for minutes, expected in ((60, {"alice": "-0.400", "bob": "-1.500"}),
                                  (7, {"alice": "-0.047", "bob": "-0.175"})):  # 0.4·7/60 = 0.0466…
            postings, carry = debits.postings(
                AllocationRecordsSource(ledger).usage(start, start + timedelta(minutes=minutes)),
                start, start + timedelta(minutes=minutes))
            got = {p.account: str(p.amount) for p in postings if p.account in expected}
            assert got == expected, (minutes, postings)
        by_user = {p.account: p for p in postings}
        assert by_user["alice"].model == f"{A100} MIG 1g.10gb"
        assert by_user["alice"].reason == f"0.117 h of a 1g.10gb MIG instance of {A100}"
        assert carry[("alice", f"{A100} MIG 1g.10gb")] == Decimal("0.4") * 7 / 60 - Decimal("0.047")
    finally:
        ledger.close()

    # GET pool: the instances inside their GPU, the held ones with their holder
    gpus = _pool_gpus(hub)
    mixed = {m["uuid"]: m for m in gpus["GPU-a100-1"]["mig"]}
    assert [m["profile"] for m in gpus["GPU-a100-1"]["mig"]] == ["3g.40gb", "3g.40gb", "1g.10gb"]
    assert [(h["user"], h["server"]) for h in mixed["MIG-1-1g-0"]["holders"]] == [("alice", "")]
    assert [(h["user"], h["server"]) for h in mixed["MIG-1-3g-0"]["holders"]] == [("bob", "big")]
    assert mixed["MIG-1-3g-1"]["holders"] == [] and mixed["MIG-1-3g-0"]["fraction"] == "0.428"
    assert all(m["holders"] == [] for m in gpus["GPU-a100-0"]["mig"])

    # the CLI's pool table lists each instance under its GPU
    from gpupool_hub import cli

    monkeypatch.setenv("GPUPOOL_TOKEN", hub.tester_token)
    assert cli.main(["--url", hub.service_api, "pool"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"1/3g\.40gb\s+MIG-1-3g-0\s+0\.428\s+bob/big", out), out
    assert re.search(r"1/1g\.10gb\s+MIG-1-1g-0\s+0\.142\s+alice/-", out), out
    assert re.search(r"1/3g\.40gb\s+MIG-1-3g-1\s+0\.000\s+free", out), out

    # the admin pool map draws the instances inside the GPU's cell, coloured by holder
    page = hub.login("admin").get(f"{hub.url}/services/gpupool/admin/pool", timeout=30)
    assert page.status_code == 200, page.text[:300]
    cell = re.search(r'<figure class="gpu"[^>]*data-node="node-mig" data-index="1".*?</figure>', page.text, re.S)
    assert cell, page.text[:2000]
    drawn = re.findall(r'<g class="mig" data-gpupool="mig" data-uuid="([^"]+)" data-profile="([^"]+)"\s+'
                       r'data-user="([^"]*)">\s*<rect class="mig-instance[^"]*"\s+x="([\d.]+)" y="2" width="([\d.]+)"',
                       cell.group(0))
    assert [(u, p, who) for u, p, who, _, _ in drawn] == [
        ("MIG-1-3g-0", "3g.40gb", "bob"), ("MIG-1-3g-1", "3g.40gb", ""), ("MIG-1-1g-0", "1g.10gb", "alice")]
    xs = [float(x) for *_, x, _ in drawn]
    assert xs == sorted(xs) and xs[-1] + float(drawn[-1][4]) <= 100  # side by side, inside the GPU
    assert 'data-state="shared"' in cell.group(0)

    # stopping gives the instance back: the next 1g gets it again
    stop_server(hub, "alice")
    wait_for(lambda: _pool_gpus(hub)["GPU-a100-1"]["mig"][2]["holders"] == [], 20, "alice's 1g to be released")
    carol = start_ok(hub, "carol", {"profile": "a100-1g"})
    assert carol["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-1-1g-0"
    assert carol["env"]["GPUPOOL_PROFILE"] == "a100-1g"
