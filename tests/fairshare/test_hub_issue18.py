"""Issue 18 with a real hub: VDK scenario 2 after a history of requests, a reclaim's wait
against the hub's start timeout, and a cancelled spawn that cancels its reclaim (4 nodes x
10 GPUs, two teams of 20)."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import wait_for
from tests.spawner.conftest import (
    allocations, progress_events, server_path, spawn, user_model,
)

from .conftest import clear_pool, team_hub, team_hub_config

pytestmark = pytest.mark.integration

GRACE = 8
EXTRA = team_hub_config(GRACE, """
c.GPUPool.preempt_cooldown = 0
c.Spawner.start_timeout = 5
""")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from team_hub(tmp_path_factory, "fairhub18", EXTRA, users_per_team=4)


@pytest.fixture(autouse=True)
def _clean(hub):
    yield
    clear_pool(hub)


def vision_borrows(hub):
    """a0-a2 hold 8 GPUs each (allocations only); a3 runs a real, borrowed 8-GPU server, the newest."""
    for i in range(3):
        r = hub.service("POST", "/allocations", hub.spawner_token,
                        json={"user": f"a{i}", "request": {"gpus": 8, "models": ["H100"]}})
        assert r.status_code == 201, r.text
    r = spawn(hub, "a3", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    assert progress_events(hub, "a3")[-1].get("ready")


def reclaims(hub):
    r = hub.service("GET", "/teams", hub.tester_token)
    assert r.status_code == 200, r.text
    return r.json()["reclaims"]


def preempts(hub):
    r = hub.service("GET", "/audit", hub.tester_token)
    return [e for e in r.json()["events"] if e["action"] == "preempt"]


@pytest.mark.parametrize("history_gpus", [5, 6])
def test_18_1_vdk_scenario_after_history_b_starts(hub, history_gpus):
    # a history of 20 five-GPU (or six-GPU) requests (through the service API, started and stopped)...
    for i in range(4):
        hub.create_user(f"h{i}")
    for i in range(20):
        r = hub.service("POST", "/allocations", hub.spawner_token,
                        json={"user": f"h{i % 4}", "request": {"gpus": history_gpus, "models": ["H100"]}})
        assert r.status_code == 201, r.text
        assert hub.service("DELETE", f"/allocations/{r.json()['allocation']['id']}",
                           hub.spawner_token).status_code == 200
    # ...then team A's six 3-GPU servers and team B's 8-GPU one, through the real hub
    for i in range(6):
        hub.create_user(f"a{i}", ["vision"])
        r = spawn(hub, f"a{i}", {"profile": "h100", "gpus": 3})
        assert r.status_code in (201, 202), r.text
        assert progress_events(hub, f"a{i}")[-1].get("ready"), f"a{i}"
    nodes = sorted({a["node"] for a in allocations(hub) if a["user"].startswith("a")})
    seen = len(preempts(hub))
    r = spawn(hub, "b0", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    # the configured profile (up to 10 GPUs, team B owed 20) kept a node able to host it: team A
    # packed instead of spreading, and B starts at once, nobody preempted (A is within quota)
    wait_for(lambda: (user_model(hub, "b0").get("servers", {}).get("") or {}).get("ready"), timeout=30,
             what=f"b0's 8-GPU server to start (team A on {nodes})")
    assert len(nodes) <= 3 and len(preempts(hub)) == seen, nodes


def test_18_4_reclaim_wait_outlasting_start_timeout_still_starts(hub):
    # preempt_grace (8 s) is above the hub's start_timeout (5 s): the spawner raised its
    # own start_timeout to cover the grace, so the waiting spawn is not killed with an
    # empty "Spawn failed:" while the victim is stopped later for nobody
    vision_borrows(hub)
    r = spawn(hub, "b0", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    events = progress_events(hub, "b0", timeout=60)
    text = " ".join(e.get("message", "") for e in events)
    assert events[-1].get("ready"), events
    assert "Waiting for borrowed GPUs to be reclaimed" in text
    assert [a["user"] for a in allocations(hub) if a["user"] == "b0"] == ["b0"]
    wait_for(lambda: "" not in user_model(hub, "a3").get("servers", {}), what="a3's server to stop")


def test_18_2_cancelled_spawn_cancels_its_reclaim(hub):
    vision_borrows(hub)
    seen = len(preempts(hub))
    r = spawn(hub, "b1", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: reclaims(hub), what="the reclaim for b1")
    [rc] = reclaims(hub)
    assert rc["user"] == "b1" and [v["user"] for v in rc["victims"]] == ["a3"]
    deadline = time.time() + GRACE
    # b1 deletes the pending server: the reclaim ends at once, well before its deadline
    r = hub.hub_request("DELETE", server_path("b1"))
    assert r.status_code in (202, 204), r.text
    wait_for(lambda: not reclaims(hub), what="the reclaim to be cancelled", timeout=GRACE - 2)
    assert time.time() < deadline
    me = hub.service("GET", "/me", hub.token_for("a3")).json()
    assert me["cull_warning"] is None
    # past the deadline the victim still runs, nobody was preempted, the GPUs are a3's
    wait_for(lambda: time.time() > deadline + 3, what="the reclaim's deadline to pass")
    assert user_model(hub, "a3")["servers"][""]["ready"]
    assert len(preempts(hub)) == seen
    assert [a["user"] for a in allocations(hub)].count("a3") == 1
    assert not any(a["user"] == "b1" for a in allocations(hub))


def test_18_5_preempted_user_is_told_until_dismissed(hub):
    # a3's borrowed server is preempted for b2: a3's next visit to the hub says so, until a3
    # dismisses it; b2 never sees it, nor may dismiss it
    alice, bob = hub.token_for("a3"), hub.token_for("b2")
    for old in hub.service("GET", "/me/notices", alice).json()["notices"]:  # of earlier tests
        assert hub.service("POST", f"/me/notices/{old['id']}", alice).status_code == 204
    vision_borrows(hub)
    r = spawn(hub, "b2", {"profile": "h100", "gpus": 8})
    assert r.status_code in (201, 202), r.text
    assert progress_events(hub, "b2", timeout=60)[-1].get("ready")
    wait_for(lambda: "" not in user_model(hub, "a3").get("servers", {}), what="a3's server to stop")
    # 18.7: the node agents now stop any GPU process of a3 on GPUs a3 no longer holds (a3 holds none)
    enforce = hub.service("GET", "/nodes/node-0/enforce", hub.tester_token).json()
    assert enforce["allowed"].get("a3") == [], enforce
    [n] = hub.service("GET", "/me", alice).json()["notices"]
    assert n["kind"] == "preempted" and "reclaimed for another team" in n["title"] and "team nlp" in n["why"]
    assert "files" in n["kept"]
    assert hub.service("GET", "/me/notices", alice).json()["notices"] == [n]
    session = hub.login("a3")
    page = session.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert f'data-notice="{n["id"]}"' in page and n["what"] in page and n["because"] in page
    # where to dismiss it: the spawn page has no button; My GPU usage (a hub page) and JupyterLab do
    assert "until you dismiss it on" in page and "My GPU usage</a> or in JupyterLab" in page
    assert hub.service("GET", "/me", bob).json()["notices"] == []
    assert hub.service("DELETE", f"/me/notices/{n['id']}", bob).status_code == 404
    assert hub.service("GET", "/me/notices", alice).json()["notices"] == [n]
    assert hub.service("DELETE", f"/me/notices/{n['id']}", alice).status_code == 204
    assert hub.service("GET", "/me", alice).json()["notices"] == []
    page = session.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert "data-notice" not in page and "until you dismiss it" not in page
