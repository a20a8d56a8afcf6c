"""Culling in a real hub with real single-user servers and real kernels.

One hub, five users, in order: without pressure nothing is culled (but the
floor stops a server regardless); once GPUs get scarce a negative user is
warned, then their kernels are shut down after the grace period while their
notebook stays intact; positive and exempt users are never touched; every
action is in the audit log.
"""

from __future__ import annotations

import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from tests.fixtures.hub import wait_for

pytestmark = pytest.mark.integration

SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")

EXTRA = f"""
c.JupyterHub.spawner_class = "gpupool-simple"
c.Spawner.cmd = [{SINGLEUSER!r}]
import os
if os.geteuid() == 0:  # CI runs as root; Jupyter Server refuses root without this
    c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 90  # the server's own start: jupyterhub-singleuser on two busy cores may pass 60 s
c.Spawner.http_timeout = 90
c.GPUPoolSpawner.profiles = [
    {{"slug": "cpu", "display_name": "CPU", "default": True}},
    {{"slug": "2x3090", "display_name": "2 x 3090", "gpus": 2, "models": ["RTX 3090"]}},
    {{"slug": "half", "display_name": "half A6000", "gpu_fraction": 0.5, "models": ["RTX A6000"]}},
]
c.Culler.interval = 0.5
c.Culler.grace_period = 4
c.Culler.pressure_allocated_fraction = 0.3
c.Culler.pressure_refusal_window = 0
c.Culler.exempt_users = {{"vip"}}
c.GPUPoolService.reconcile_interval = 3600
# the hub stops its services before the servers at shutdown: do not wait long for releases then
c.GPUPoolSpawner.release_wait = 1
"""

NOTEBOOK = {
    "type": "notebook",
    "content": {"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [],
                           "execution_count": None}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from tests.fixtures.hub import Hub, require_hub_binaries

    require_hub_binaries()
    if not Path(SINGLEUSER).exists():
        pytest.skip("jupyterhub-singleuser is not installed in this environment")
    workdir = tmp_path_factory.mktemp("hub")
    hub = Hub(workdir, extra_config=EXTRA + f'\nc.SimpleLocalProcessSpawner.home_dir_template = "{workdir}/home/{{username}}"\n')
    hub.start()
    hub.tokens = {}
    for name in ("alice", "bob", "carol", "dave", "vip"):
        hub.create_user(name)
        hub.tokens[name] = hub.token_for(name)
    yield hub
    hub.stop()


def spawn(hub, name, profile):
    r = hub.hub_request("POST", f"/users/{name}/server", json={"profile": profile}, timeout=120)
    assert r.status_code in (201, 202), r.text

    def ready():
        server = hub.hub_request("GET", f"/users/{name}").json()["servers"].get("")
        return server and server.get("ready")

    wait_for(ready, 120, f"{name}'s server")


def server_running(hub, name):
    return "" in hub.hub_request("GET", f"/users/{name}").json()["servers"]


def user_api(hub, name, method, path, **kw):
    return requests.request(method, f"{hub.url}/user/{quote(name)}/api/{path}",
                            headers={"Authorization": f"token {hub.tokens[name]}"}, timeout=60, **kw)


def start_kernel(hub, name):
    r = user_api(hub, name, "POST", "kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def kernels(hub, name):
    r = user_api(hub, name, "GET", "kernels")
    assert r.status_code == 200, r.text
    return [k["id"] for k in r.json()]


def me(hub, name):
    return hub.service("GET", "/me", hub.tokens[name]).json()


def set_balance(hub, name, target):
    balance = Decimal(hub.service("GET", f"/users/{name}", hub.tester_token).json()["balance"])
    r = hub.service("POST", f"/users/{name}/grant", hub.tester_token,
                    json={"amount": str(Decimal(target) - balance), "reason": "test: set balance"})
    assert r.status_code == 201, r.text


def audit(hub, name):
    """What culling did to ``name`` (the grants that set up each balance are audited too: left out)."""
    return [(e["action"], e["dry_run"]) for e in
            hub.service("GET", f"/audit?user={quote(name)}", hub.tester_token).json()["events"]
            if e["action"] != "grant"][::-1]


def test_no_cull_without_pressure_but_the_floor_stops_a_server(hub):
    spawn(hub, "carol", "half")
    spawn(hub, "dave", "half")  # 1 of 6 GPUs allocated: no pressure
    kernel = start_kernel(hub, "carol")
    set_balance(hub, "carol", "-1")
    set_balance(hub, "dave", "-10")
    # the floor stops dave's server regardless of pressure
    wait_for(lambda: not server_running(hub, "dave"), 30, "dave's server to stop")
    assert me(hub, "dave")["allocations"] == []
    assert ("stop_server", False) in audit(hub, "dave")
    stop = next(e for e in hub.service("GET", "/audit?user=dave", hub.tester_token).json()["events"]
                if e["action"] == "stop_server")
    assert len(stop["detail"]["released"]) == 1  # issue 18.6: the audit names the GPUs the stop gave back
    # carol is negative, but GPUs are not scarce: no warning, kernel alive
    time.sleep(3)
    assert me(hub, "carol")["cull_warning"] is None
    assert kernels(hub, "carol") == [kernel]
    assert audit(hub, "carol") == []


def test_under_pressure_a_negative_user_is_warned_then_their_kernels_culled(hub):
    spawn(hub, "bob", "half")
    bob_kernel = start_kernel(hub, "bob")
    spawn(hub, "vip", "half")
    set_balance(hub, "vip", "-5")
    spawn(hub, "alice", "2x3090")  # 3.5 of 6 GPUs allocated: pressure
    r = user_api(hub, "alice", "PUT", "contents/work.ipynb", json=NOTEBOOK)
    assert r.status_code in (200, 201), r.text
    alice_kernel = start_kernel(hub, "alice")
    set_balance(hub, "alice", "-2")

    warning = wait_for(lambda: me(hub, "alice")["cull_warning"], 20, "alice's cull warning")
    assert warning["action"] == "kernels" and "pressure" in warning["reason"] and warning["deadline"]
    assert kernels(hub, "alice") == [alice_kernel]  # the grace period is not over yet

    wait_for(lambda: not kernels(hub, "alice"), 30, "alice's kernels to be shut down")
    # the notebook is intact and the server still runs; the GPUs went back to the pool
    nb = user_api(hub, "alice", "GET", "contents/work.ipynb").json()
    assert nb["content"]["cells"][0]["source"] == "x = 1"
    assert server_running(hub, "alice")
    assert me(hub, "alice")["allocations"] == []
    assert audit(hub, "alice")[:2] == [("warn", False), ("cull_kernels", False)]
    event = hub.service("GET", "/audit?user=alice", hub.tester_token).json()["events"]
    culled = [e for e in event if e["action"] == "cull_kernels"][0]
    assert culled["detail"]["kernels"] == [alice_kernel] and culled["detail"]["released"]

    # carol (negative, still holding half an A6000) is now warned too
    wait_for(lambda: me(hub, "carol")["cull_warning"], 20, "carol's warning under pressure")


def test_positive_and_exempt_users_are_never_culled(hub):
    assert kernels(hub, "bob")  # positive balance: kernel alive throughout
    assert me(hub, "bob")["cull_warning"] is None and me(hub, "bob")["allocations"]
    assert audit(hub, "bob") == []
    assert me(hub, "vip")["cull_warning"] is None
    assert audit(hub, "vip") == []
    assert server_running(hub, "vip")


def test_audit_log_needs_admin(hub):
    assert hub.service("GET", "/audit", hub.tokens["alice"]).status_code == 403
