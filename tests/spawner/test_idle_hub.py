"""Idle GPUs taken back, with a real hub, tiny servers and the real service. Bob
asks for 2 x RTX 3090 while alice holds both at 0 % utilization: bob is shown
position 1 with an estimate; alice is warned (``GET me``), her server stops
after the grace, bob's spawn completes by itself, and both events are audited.

The scenario runs twice, once per utilization source: the node agents' reports
(``PUT nodes/{node}/utilization``, the path without Prometheus, idle_after shortened
to seconds) and a real Prometheus whose backfilled history has alice's two GPUs at
0 % for two hours (the agent's ``gpupool_agent_gpu_utilization_ratio`` and memory
gauges, labelled as agent/metrics.py exports them). Both check what ``GET me``
shows alice (her GPUs' utilization and memory, idle since, the reclaim deadline)
and bob (position 1, an estimate)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pytest

from tests.fixtures.hub import wait_for
from tests.fixtures.prometheus import OpenMetricsHistory

from .conftest import spawn, spawner_hub, user_model
from .test_queue_hub import Progress, queue

pytestmark = pytest.mark.integration

NODE = [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"index": i, "uuid": f"GPU-idle-{i}", "model": "NVIDIA GeForce RTX 3090"} for i in range(2)]}]
AGENT_TOKEN = "agent-secret-node-a"
GIB = 1 << 30

COMMON = f"""
c.GPUPool.nodes = {json.dumps(NODE)}
c.GPUPool.idle_grace = 4
c.GPUPool.min_runtime = 1
c.GPUPoolService.idle_interval = 0.5
c.GPUPoolService.queue_interval = 0.5
c.GPUPoolService.agent_tokens = {{"node-a": {AGENT_TOKEN!r}}}
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.5}}  # the POST answers 202 at once for a waiting spawn
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from spawner_hub(tmp_path_factory, "idlehub", COMMON + "c.GPUPool.idle_after = 2\n")


@pytest.fixture(scope="module")
def prom_hub(tmp_path_factory, prometheus_factory):
    """Alice's GPUs at 0 % (1 of 24 GiB used) from two hours ago until after the test."""
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    span = [(now - timedelta(hours=2), now + timedelta(minutes=30), 0)]
    h = OpenMetricsHistory()
    for g in NODE[0]["gpus"]:
        labels = {"gpu_uuid": g["uuid"], "model": g["model"], "node": "node-a", "index": str(g["index"])}
        h.gauge("gpupool_agent_gpu_utilization_ratio", labels, span, step=15)
        h.gauge("gpupool_agent_gpu_memory_used_bytes", labels, [(a, b, GIB) for a, b, _ in span], step=15)
        h.gauge("gpupool_agent_gpu_memory_total_bytes", labels, [(a, b, 24 * GIB) for a, b, _ in span], step=15)
    prom = prometheus_factory(h)
    # an hour of idleness counts: the history has two
    extra = f"c.GPUPool.idle_after = 3600\nc.GPUPoolService.prometheus_url = {prom.url!r}\n"
    yield from spawner_hub(tmp_path_factory, "idleprom", COMMON + extra)


def running(hub, user):
    srv = user_model(hub, user).get("servers", {}).get("")
    return bool(srv and srv.get("ready"))


def report(hub, values, memory=None):
    body = {"gpus": values, "memory": memory} if memory else {"gpus": values}
    r = hub.service("PUT", "/nodes/node-a/utilization", AGENT_TOKEN, json=body)
    assert r.status_code == 200, r.text


def audit(hub, user):
    events = hub.service("GET", f"/audit?user={quote(user)}", hub.tester_token).json()["events"]
    return [e["action"] for e in events][::-1]


def test_an_idle_server_is_stopped_for_a_waiting_user(hub):
    """Utilization from the agents' reports."""
    idle_scenario(hub, lambda: report(hub, {"GPU-idle-0": 0.0, "GPU-idle-1": 0.0},
                                      {"GPU-idle-0": [GIB, 24 * GIB], "GPU-idle-1": [GIB, 24 * GIB]}))


def test_an_idle_server_is_stopped_for_a_waiting_user_prometheus(prom_hub):
    """Utilization from Prometheus: nothing to report, the history says it."""
    idle_scenario(prom_hub, lambda: None)


def idle_scenario(hub, make_idle):
    r = spawn(hub, "alice", {"profile": "2x3090"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: running(hub, "alice"), 60, "alice's server")
    alice = hub.token_for("alice")
    make_idle()

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
    waiting = wait_for(lambda: hub.service("GET", "/me", hub.token_for("bob")).json()["waiting"], 10, "bob's me")
    assert [(w["position"], w["queue_length"], w["server"]) for w in waiting] == [(1, 1, "")]
    assert waiting[0]["eta"]  # the estimate: alice's reclaim deadline once she is warned

    warning = wait_for(lambda: hub.service("GET", "/me", alice).json()["cull_warning"], 30, "alice's idle warning")
    assert warning["action"] == "server" and "idle" in warning["reason"] and warning["deadline"]
    [srv] = hub.service("GET", "/me", alice).json()["gpu_servers"]  # what her widget shows
    assert [(g["utilization"], g["memory_used_bytes"], g["memory_total_bytes"]) for g in srv["gpus"]] == [
        (0.0, GIB, 24 * GIB)] * 2
    assert srv["idle_since"] and srv["reclaimable_at"] and srv["reclaim_deadline"] == warning["deadline"]
    assert running(hub, "alice")
    # the admins' view marks her GPUs idle: GET pool and `gpupool pool`
    holders = [h for n in hub.service("GET", "/pool", hub.tester_token).json()["nodes"]
               for g in n["gpus"] for h in g["holders"]]
    assert [(h["user"], bool(h.get("idle_since"))) for h in holders] == [("alice", True)] * 2
    env = {**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tester_token}
    out = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "pool"], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    # both GPUs marked idle with a time (GET me's and GET pool's views are read at different
    # moments: under load the idle run's start may have been re-read in between)
    idle_line = re.compile(r"alice/- \(1\.000\) idle since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    assert sum(bool(idle_line.search(line)) for line in out.splitlines()) == 2, out

    bob.join(60)
    assert bob.events[-1].get("ready"), bob.events
    assert not running(hub, "alice")
    assert hub.service("GET", "/me", alice).json()["cull_warning"] is None
    assert [a for a in audit(hub, "alice") if a.startswith("idle")] == ["idle_warn", "idle_reclaim"]
    assert hub.service("GET", "/me", hub.token_for("bob")).json()["waiting"] == []


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
