"""Issue 27.1: nothing the pool runs lends a user's server authority beyond that server.

A user's code runs inside her server and can log every header it receives; a
probe did, caught the service's own hub token during a kernel cull and used it
to run code in other users' kernels and to allocate GPUs billed to them. Here
a real hub runs ``recording_server.py`` as each user's server: it asks the hub,
at once, whose each token it receives is and which scopes it has. Through the
four ways the pool takes GPUs back (a kernel cull at a negative balance under
pressure, an idle reclaim, a fair-share reclaim, a memory stop by the node
agent) it may see nothing but a token of its own user with
``access:servers!server=<user>/<name>`` (the cull's; it expires within minutes
and is deleted after use; JupyterHub lets every token read its owner's own
name and groups) or the server's own token.

Then the tokens themselves, in a hub from the example configuration: the
spawner's secret is not the service's token and no hub token at all, and the
service's hub token holds exactly the scopes docs/admin-guide.md lists.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.agent.conftest import gpu, make_nvml, procs, scripts_dir, test_users  # noqa: F401  (fixtures)
from tests.fairshare.conftest import team_hub_config
from tests.fixtures.hub import Hub, require_hub_binaries, wait_for

from .conftest import REPO, shut_down

pytestmark = pytest.mark.integration

RECORDER = Path(__file__).with_name("recording_server.py")
AGENT_TOKEN = "agent-secret-node-a-0123456789"
GIB = 1 << 30
A100 = "NVIDIA A100-SXM4-80GB"
MEMORY_USER = "gpupool-t1"  # a Unix account (tests/agent/conftest.py): the agent finds processes by owner


def common(workdir: Path) -> str:
    return f"""
c.JupyterHub.spawner_class = "gpupool-simple"
c.JupyterHub.cleanup_servers = True
c.Spawner.cmd = [sys.executable, {str(RECORDER)!r}]
c.Spawner.http_timeout = 60
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home") + "/{username}"!r}
c.GPUPoolService.reconcile_interval = 3600
c.GPUPoolSpawner.release_wait = 1
c.GPUPoolService.agent_tokens = {{"node-a": {AGENT_TOKEN!r}}}
"""


def node(model: str, count: int) -> list[dict[str, Any]]:
    return [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
             "gpus": [{"index": i, "uuid": f"GPU-{i:04d}-fake", "model": model} for i in range(count)]}]


#: per way of taking GPUs back: the hub's configuration beyond ``common``
KINDS = {
    "cull": f"""
c.GPUPool.nodes = {json.dumps(node("NVIDIA GeForce RTX 3090", 4))}
c.GPUPoolSpawner.profiles = [{{"slug": "gpu", "display_name": "2 x 3090", "gpus": 2, "models": ["RTX 3090"]}}]
c.Culler.interval = 0.5
c.Culler.grace_period = 1
c.Culler.pressure_allocated_fraction = 0.3
c.Culler.pressure_refusal_window = 0
""",
    "idle": f"""
c.GPUPool.nodes = {json.dumps(node("NVIDIA GeForce RTX 3090", 2))}
c.GPUPoolSpawner.profiles = [{{"slug": "gpu", "display_name": "2 x 3090", "gpus": 2, "models": ["RTX 3090"]}}]
c.GPUPool.idle_after = 1
c.GPUPool.idle_grace = 1
c.GPUPool.min_runtime = 0
c.GPUPoolService.idle_interval = 0.5
c.GPUPoolService.queue_interval = 0.5
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.5}}
""",
    "fairshare": team_hub_config(1),  # 4 nodes x 10 H100, teams vision and nlp of 20 GPUs each
    "memory": f"""
c.GPUPool.nodes = {json.dumps(node(A100, 1))}
c.GPUPool.prices = {{"A100": 3}}
c.GPUPoolSpawner.profiles = [{{"slug": "gpu", "display_name": "half A100", "gpu_fraction": 0.5, "models": ["A100"]}}]
""",
}


@pytest.fixture(params=sorted(KINDS))
def kind_hub(request, tmp_path):
    require_hub_binaries()
    hub = Hub(tmp_path, common(tmp_path) + KINDS[request.param])
    try:
        hub.start()
        yield request.param, hub
    finally:
        shut_down(hub)


# ---------------------------------------------------------------- helpers


def identify_scopes(user: str) -> set[str]:
    """What JupyterHub adds to every token of ``user``: reading her own name and groups."""
    return {f"read:users:name!user={user}", f"read:users:groups!user={user}"}


def q(name: str) -> str:
    return quote(name, safe="")


def start_server(hub: Hub, user: str, options: dict[str, Any], groups: list[str] = (),  # type: ignore[assignment]
                 wait: bool = True) -> None:
    hub.create_user(user, groups)
    r = hub.hub_request("POST", f"/users/{q(user)}/server", json={"user_options": options}, timeout=120)
    assert r.status_code in (201, 202), r.text
    if wait:
        wait_for(lambda: running(hub, user), 90, f"{user}'s server")


def running(hub: Hub, user: str) -> bool:
    server = hub.hub_request("GET", f"/users/{q(user)}").json()["servers"].get("")
    return bool(server and server.get("ready"))


def audited(hub: Hub, user: str, action: str) -> bool:
    events = hub.service("GET", f"/audit?user={q(user)}", hub.tester_token).json()["events"]
    return any(e["action"] == action and not e["dry_run"] for e in events)


def set_balance(hub: Hub, user: str, target: str) -> None:
    balance = Decimal(hub.service("GET", f"/users/{q(user)}", hub.tester_token).json()["balance"])
    r = hub.service("POST", f"/users/{q(user)}/grant", hub.tester_token,
                    json={"amount": str(Decimal(target) - balance), "reason": "test: set balance"})
    assert r.status_code == 201, r.text


def seen(hub: Hub, user: str) -> list[dict[str, Any]]:
    path = hub.workdir / "home" / user / "credentials.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def report_idle(hub: Hub) -> None:
    r = hub.service("PUT", "/nodes/node-a/utilization", AGENT_TOKEN,
                    json={"gpus": {"GPU-0000-fake": 0.0, "GPU-0001-fake": 0.0}})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------- the four ways


def cull(hub: Hub) -> str:
    start_server(hub, "alice", {"profile": "gpu"})  # 2 of 4 GPUs: over 30 %, under pressure
    set_balance(hub, "alice", "-2")
    [first] = wait_for(lambda: seen(hub, "alice"), 30, "the cull's first call to alice's server")
    # while the server holds the call, the token is alive: it expires within minutes
    assert first["path"] == "/user/alice/api/kernels", first
    assert (first["whoami"].get("kind"), first["whoami"].get("name")) == ("user", "alice"), first["whoami"]
    model = hub.hub_request("GET", f"/users/alice/tokens/{first['whoami']['token_id']}").json()
    assert set(model["scopes"]) == {"access:servers!server=alice/", *identify_scopes("alice")}, model
    expires = datetime.fromisoformat(model["expires_at"].replace("Z", "+00:00"))
    assert expires - datetime.now(timezone.utc) <= timedelta(minutes=5), model
    (hub.workdir / "home" / "alice" / "release").touch()
    wait_for(lambda: audited(hub, "alice", "cull_kernels"), 30, "alice's kernels culled")
    events = hub.service("GET", "/audit?user=alice", hub.tester_token).json()["events"]
    assert next(e for e in events if e["action"] == "cull_kernels")["detail"]["kernels"] == ["0b1d-kernel"]
    # used, then deleted: the token no longer opens anything
    assert all(requests.get(f"{hub.api}/user", headers={"Authorization": f"token {r['token']}"},
                            timeout=30).status_code == 403 for r in seen(hub, "alice"))
    return "alice"


def idle(hub: Hub) -> str:
    start_server(hub, "alice", {"profile": "gpu"})
    start_server(hub, "bob", {"profile": "gpu"}, wait=False)  # waits in the queue for alice's GPUs

    def reclaimed() -> bool:
        report_idle(hub)
        return audited(hub, "alice", "idle_reclaim")

    wait_for(reclaimed, 60, "alice's idle server reclaimed for bob")
    wait_for(lambda: running(hub, "bob"), 60, "bob's server, on alice's GPUs")
    return "alice"


def fairshare(hub: Hub) -> str:
    vision = [f"a{i}" for i in range(4)]
    for user in vision:  # 32 GPUs for a team of 20: the last two servers run on nlp's GPUs
        start_server(hub, user, {"profile": "h100", "gpus": 8}, ["vision"])
    start_server(hub, "b0", {"profile": "h100", "gpus": 8}, ["nlp"])  # nlp takes its GPUs back
    [victim] = wait_for(lambda: [u for u in vision if audited(hub, u, "preempt")], 60, "a vision server preempted")
    assert not running(hub, victim)
    return victim


def memory(hub: Hub, procs, make_nvml) -> str:  # noqa: F811
    from gpupool_hub.agent.app import GPUPoolAgent

    start_server(hub, MEMORY_USER, {"profile": "gpu"})
    hog = procs.sleeper(MEMORY_USER)  # the kernel: 50 GiB on a half share of 80 GiB (44 GiB allowed)
    nv = make_nvml([gpu(0, processes=[{"pid": hog.pid, "memory": 50 * GIB}])])
    agent = GPUPoolAgent(nvml=nv, service_url=f"{hub.url}/services/gpupool/", node_name="node-a",
                         token=AGENT_TOKEN, min_uid=100, metrics_min_uid=100, grace=1.0, memory_grace=1.0)
    agent.setup()

    async def until_stopped() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (await agent.tick()).memory_actions:
                return
            await asyncio.sleep(0.2)
        raise AssertionError("the agent never stopped the process over its share")

    asyncio.run(until_stopped())
    hog.wait(10)
    wait_for(lambda: audited(hub, MEMORY_USER, "memory_stop"), 30, "the memory stop audited")
    return MEMORY_USER


def test_a_users_server_sees_no_token_beyond_itself(kind_hub, request):
    kind, hub = kind_hub
    if kind == "memory":
        user = memory(hub, request.getfixturevalue("procs"), request.getfixturevalue("make_nvml"))
    else:
        user = {"cull": cull, "idle": idle, "fairshare": fairshare}[kind](hub)
    records = [r for name in sorted(p.name for p in (hub.workdir / "home").iterdir()) for r in seen(hub, name)]
    if kind == "cull":
        assert records, "the cull called alice's server: the test would see any token it sent"
    for r in records:
        if r["own"]:
            continue  # the server's own token, which the hub gave it
        who = r["whoami"]
        assert who.get("kind") == "user" and who.get("name") == user, f"{kind}: a token of someone else: {who}"
        allowed = {f"access:servers!server={user}/", *identify_scopes(user)}
        assert set(who["scopes"]) <= allowed, f"{kind}: {r['method']} {r['path']}: {who}"


# ------------------------------------------------------------ the tokens


def documented_service_scopes() -> set[str]:
    """The scopes in the table of docs/admin-guide.md, "Tokens and scopes", row gpupool-service."""
    text = (REPO / "docs" / "admin-guide.md").read_text()
    [row] = [line for line in text.splitlines() if line.startswith("| `gpupool-service`")]
    return set(re.findall(r"`([a-z:_]+)`", row.split("|")[2]))


def test_the_spawner_and_the_service_hold_separate_tokens_and_the_documented_scopes(example_hub_factory):
    from jupyterhub.scopes import expand_scopes

    hub = example_hub_factory()
    assert hub.spawner_token != hub.service_token
    assert (hub.workdir / "gpupool_spawner_token").stat().st_mode & 0o777 == 0o600

    # the service's hub token holds exactly what the docs list (and the example's role grants)
    r = requests.get(f"{hub.api}/user", headers={"Authorization": f"token {hub.service_token}"}, timeout=30)
    assert r.status_code == 200, r.text
    model = r.json()
    assert (model["kind"], model["name"]) == ("service", "gpupool")
    documented = documented_service_scopes()
    assert "access:servers" not in documented and "admin:servers" not in documented
    assert set(model["scopes"]) == set(expand_scopes(documented)), sorted(model["scopes"])

    # the spawner's secret is no hub token at all ...
    r = requests.get(f"{hub.api}/user", headers={"Authorization": f"token {hub.spawner_token}"}, timeout=30)
    assert r.status_code == 403
    # ... and the service takes it, but not its own hub token, as the spawner
    assert hub.service("GET", "/allocations", hub.spawner_token).status_code == 200
    r = hub.service("GET", "/allocations", hub.service_token)
    assert r.status_code == 403 and "spawner_token" in r.json()["message"], r.text
