"""Idle GPUs taken back, with a real hub, tiny servers and the real service. Bob
asks for 2 x RTX 3090 while alice holds both at 0 % utilization: bob is shown
position 1 with an estimate; alice is warned (``GET me``), her server stops
after the grace, bob's spawn completes by itself, and both events are audited.

Utilization comes from the node agents' reports (``PUT nodes/{node}/utilization``,
the path without Prometheus), with idle_after and the grace shortened to seconds."""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import quote

import pytest

from tests.fixtures.hub import wait_for

from .conftest import spawn, spawner_hub, user_model
from .test_queue_hub import Progress, queue

pytestmark = pytest.mark.integration

NODE = [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"index": i, "uuid": f"GPU-idle-{i}", "model": "NVIDIA GeForce RTX 3090"} for i in range(2)]}]
AGENT_TOKEN = "agent-secret-node-a"

EXTRA = f"""
c.GPUPool.queue_enabled = True
c.GPUPool.nodes = {json.dumps(NODE)}
c.GPUPool.idle_after = 2
c.GPUPool.idle_grace = 4
c.GPUPool.min_runtime = 1
c.GPUPoolService.idle_interval = 0.5
c.GPUPoolService.queue_interval = 0.5
c.GPUPoolService.agent_tokens = {{"node-a": {AGENT_TOKEN!r}}}
c.Spawner.start_timeout = 120
c.JupyterHub.slow_spawn_timeout = 0.5
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from spawner_hub(tmp_path_factory, "idlehub", EXTRA)


def running(hub, user):
    srv = user_model(hub, user).get("servers", {}).get("")
    return bool(srv and srv.get("ready"))


def report(hub, values):
    r = hub.service("PUT", "/nodes/node-a/utilization", AGENT_TOKEN, json={"gpus": values})
    assert r.status_code == 200, r.text


def audit(hub, user):
    events = hub.service("GET", f"/audit?user={quote(user)}", hub.tester_token).json()["events"]
    return [e["action"] for e in events][::-1]


def test_an_idle_server_is_stopped_for_a_waiting_user(hub):
    r = spawn(hub, "alice", {"profile": "2x3090"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: running(hub, "alice"), 60, "alice's server")
    alice = hub.token_for("alice")
    report(hub, {"GPU-idle-0": 0.0, "GPU-idle-1": 0.0})

    # nobody waits: idle, but not warned
    hub.create_user("bob")
    asking = threading.Thread(target=spawn, args=(hub, "bob", {"profile": "2x3090"}), daemon=True)
    asking.start()  # the hub may answer the POST only once the spawn is done
    wait_for(lambda: user_model(hub, "bob").get("servers", {}).get(""), 30, "bob's spawn to begin")
    bob = Progress(hub, "bob")
    bob.start()
    wait_for(lambda: any(m.startswith("Waiting for a GPU: You are 1st in the queue") for m in bob.messages()), 30,
             "bob's position on his progress page")
    assert queue(hub)["waiting"][0]["eta"]

    warning = wait_for(lambda: hub.service("GET", "/me", alice).json()["cull_warning"], 30, "alice's idle warning")
    assert warning["action"] == "server" and "idle" in warning["reason"] and warning["deadline"]
    assert running(hub, "alice")

    bob.join(60)
    assert bob.events[-1].get("ready"), bob.events
    assert not running(hub, "alice")
    assert hub.service("GET", "/me", alice).json()["cull_warning"] is None
    assert [a for a in audit(hub, "alice") if a.startswith("idle")] == ["idle_warn", "idle_reclaim"]


def test_a_busy_server_is_not_taken_back(hub):
    r = spawn(hub, "dan", {"profile": "2x3090"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: running(hub, "dan"), 60, "dan's server")
    report(hub, {"GPU-idle-0": 0.9, "GPU-idle-1": 0.0})  # dan's server works on one of its GPUs
    hub.create_user("carol")
    threading.Thread(target=spawn, args=(hub, "carol", {"profile": "2x3090"}), daemon=True).start()
    wait_for(lambda: any(w["user"] == "carol" for w in queue(hub)["waiting"]), 30, "carol in the queue")
    dan = hub.token_for("dan")
    deadline = time.monotonic() + 8  # well past idle_after + grace
    while time.monotonic() < deadline:
        assert hub.service("GET", "/me", dan).json()["cull_warning"] is None
        report(hub, {"GPU-idle-0": 0.9, "GPU-idle-1": 0.0})
        time.sleep(0.5)
    assert "idle_warn" not in audit(hub, "dan") and running(hub, "dan")
    assert hub.service("DELETE", "/queue?user=carol", hub.spawner_token).json() == {"left": True}
