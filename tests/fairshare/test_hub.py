"""Fair share end to end: a real hub, the real service API, the spawner (4 nodes x 10 GPUs, two teams of 20)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

from tests.fixtures.hub import wait_for
from tests.service.openapi import check
from tests.spawner.conftest import (
    allocations, progress_events, spawn, user_model,
)

from .conftest import clear_pool, team_hub, team_hub_config

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

EXTRA = team_hub_config(1)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from team_hub(tmp_path_factory, "fairhub", EXTRA, users_per_team=8)


@pytest.fixture(autouse=True)
def _clean(hub):
    yield
    clear_pool(hub)


def allocate(hub, user, gpus, server=""):
    return hub.service("POST", "/allocations", hub.spawner_token,
                       json={"user": user, "server": server, "request": {"gpus": gpus, "models": ["H100"]}})


def allocate_waiting(hub, user, gpus, server="", timeout=30):
    """What the spawner does: retry while the service reclaims borrowed GPUs."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        r = allocate(hub, user, gpus, server)
        if r.status_code != 409 or r.json()["reason"] != "reclaiming":
            return r, seen
        check("Refusal", r.json())
        seen.append(r.json())
        time.sleep(0.3)
    raise AssertionError("reclaim did not finish")


def teams(hub):
    r = hub.service("GET", "/teams", hub.tester_token)
    assert r.status_code == 200, r.text
    check("Teams", r.json())
    return {t["team"]: t for t in r.json()["teams"]}


def audit(hub):
    r = hub.service("GET", "/audit", hub.tester_token)
    check("Audit", r.json())
    return [e for e in r.json()["events"] if e["action"] == "preempt"]


def test_idle_gpus_borrowed_then_reclaimed_for_the_spawner(hub):
    # vision borrows nlp's idle GPUs: four 8-GPU servers, the last two over its quota
    for i in range(4):
        r = spawn(hub, f"a{i}", {"profile": "h100", "gpus": 8})
        assert r.status_code in (201, 202), r.text
        events = progress_events(hub, f"a{i}")
        assert events[-1].get("ready"), events
        borrowed = "borrowed" in " ".join(e.get("message", "") for e in events)
        assert borrowed == (i >= 2), events
    token = hub.token_for("a3")
    me = hub.service("GET", "/me", token).json()
    check("Me", me)
    assert [a["borrowed"] for a in me["allocations"]] == [True]
    assert teams(hub)["vision"]["borrowed_gpus"] == 16
    # nlp asks for 8 GPUs: 8 are free, but only 2 per node. The newest borrowed server
    # (a3's) is warned, stopped after the grace, and b0's server starts in its place.
    a3_node = me["allocations"][0]["node"]
    r = spawn(hub, "b0", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    events = progress_events(hub, "b0")
    text = " ".join(e.get("message", "") for e in events)
    assert events[-1].get("ready"), events
    assert "Waiting for borrowed GPUs to be reclaimed" in text
    assert "borrowed" not in text.split("GPUs allocated")[-1].split(":")[0]
    mine = [a for a in allocations(hub) if a["user"] == "b0"]
    assert len(mine) == 1 and mine[0]["node"] == a3_node and not mine[0]["borrowed"]
    wait_for(lambda: "" not in user_model(hub, "a3").get("servers", {}), what="a3's server to stop")
    assert "" in user_model(hub, "a2").get("servers", {})  # one victim was enough
    [event] = audit(hub)
    assert event["user"] == "a3" and event["detail"]["for_team"] == "nlp" and event["detail"]["stopped"]
    assert hub.service("GET", "/me", token).json()["allocations"] == []
    t = teams(hub)
    assert t["nlp"]["used_gpus"] == 8 and t["vision"]["used_gpus"] == 24


def test_greedy_team_cannot_keep_the_other_teams_quota(hub):
    for i in range(6):  # vision takes 30 of 40 GPUs
        r = allocate(hub, f"a{i}", 5)
        assert r.status_code == 201, r.text
        assert r.json()["allocation"]["borrowed"] == (i >= 4)
    got = []
    for i in range(4):  # nlp still gets its 20
        r, waits = allocate_waiting(hub, f"b{i}", 5)
        assert r.status_code == 201, r.text
        got.append(r.json()["allocation"])
        assert bool(waits) == (i >= 2)
    assert not any(a["borrowed"] for a in got)
    held = {a["user"] for a in allocations(hub)}
    assert held >= {"a0", "a1", "a2", "a3"} and not held & {"a4", "a5"}
    t = teams(hub)
    assert (t["vision"]["used_gpus"], t["nlp"]["used_gpus"], t["vision"]["preempted"]) == (20, 20, 3)
    # nlp at its quota cannot preempt anyone; vision (preempted) cannot preempt back
    assert allocate(hub, "b7", 1).json()["reason"] == "no_capacity"
    assert allocate(hub, "a7", 1).json()["reason"] == "no_capacity"
    # visible to admins: GET pool, /metrics and the CLI
    pool = hub.service("GET", "/pool", hub.tester_token).json()
    check("Pool", pool)
    assert {t["team"]: t["used_gpus"] for t in pool["teams"]} == {"default": 0, "nlp": 20, "vision": 20}
    text = requests.get(f"{hub.url}/services/gpupool/metrics",
                        headers={"Authorization": f"token {hub.tester_token}"}, timeout=30).text
    assert 'gpupool_team_quota_gpus{team="nlp"} 20.0' in text
    assert 'gpupool_team_allocated_gpus{team="vision"} 20.0' in text
    assert 'gpupool_team_preemptions_total{team="vision"}' in text
    env = {**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tester_token}
    out = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "pool"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [ln.split() for ln in out.stdout.splitlines()]
    assert ["nlp", "20", "20", "0", "4"] in lines
    assert any(ln[:5] == ["vision", "20", "20", "0", "4"] and len(ln) == 6 for ln in lines), out.stdout  # cooling down


def test_fragmentation_eight_gpus_still_fit_one_node(hub):
    for i in range(6):  # vision runs six 3-GPU servers, all within its quota
        r = allocate(hub, f"a{i}", 3, server="frag")
        assert r.status_code == 201 and not r.json()["allocation"]["borrowed"], r.text
    r = allocate(hub, "b0", 8, server="frag")
    assert r.status_code == 201, r.text
    alloc = r.json()["allocation"]
    assert len({g["index"] for g in alloc["gpus"]}) == 8 and not alloc["borrowed"]
    assert audit(hub) == [] or all(e["detail"]["for_server"] != "frag" for e in audit(hub))
