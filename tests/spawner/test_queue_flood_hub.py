"""One user cannot lock the others out, and a link cannot start a paid server
(issue 27), in a real hub with the real service and tiny servers.

- One user's 100 named GPU spawns: most are refused at once (two waiting places
  per user), the two that wait do not use up the hub's ``concurrent_spawn_limit``
  (3 here), and another user then starts a CPU-only server and waits 2nd, not
  behind all of them.
- ``GET /hub/spawn/<user>/x?profile=<paid>`` sent as a cross-site navigation with
  the user's cookie starts nothing and shows the form with that profile chosen;
  the form's POST (with its xsrf token) starts it.
"""

from __future__ import annotations

import html
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures.hub import wait_for

from .conftest import allocations, spawn, spawner_hub, start_ok, user_model
from .test_queue_hub import ONE_GPU, queue

pytestmark = pytest.mark.integration

EXTRA = f"""
c.GPUPool.nodes = {json.dumps(ONE_GPU)}
c.GPUPoolService.queue_interval = 0.5
c.JupyterHub.concurrent_spawn_limit = 3
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.5}}  # the POST answers 202 at once for a waiting spawn
"""

FLOOD = 100


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from spawner_hub(tmp_path_factory, "floodhub", EXTRA)


def waiting(hub):
    return queue(hub)["waiting"]


def ready(hub, user, server=""):
    srv = user_model(hub, user).get("servers", {}).get(server)
    return bool(srv and srv.get("ready"))


def test_one_users_hundred_gpu_spawns_leave_others_able_to_start_and_queue(hub):
    start_ok(hub, "holder", {"profile": "1gpu"})  # the pool's only GPU is taken: GPU spawns must wait
    hub.create_user("mallory")

    def flood(i):
        return spawn(hub, "mallory", {"profile": "1gpu"}, server=f"s{i}").status_code

    with ThreadPoolExecutor(8) as pool:  # bounded concurrency: 8 requests in flight at most
        list(pool.map(flood, range(FLOOD)))

    def settled():  # the refused spawns have ended; the two that wait tell the hub "queue", not "spawn"
        pending = [s["pending"] for s in user_model(hub, "mallory")["servers"].values() if s.get("pending")]
        return pending == ["queue", "queue"] and len([w for w in waiting(hub) if w["user"] == "mallory"]) == 2

    wait_for(settled, 30, "mallory's refused spawns to end and two to wait")

    # another user starts a CPU-only server: the hub's spawn limit is not used up by the waiters
    r = spawn(hub, "bob", {"profile": "cpu"})
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}"
    wait_for(lambda: ready(hub, "bob"), 30, "bob's CPU-only server")
    # and his GPU server waits right after mallory's first, not behind all of hers
    r = spawn(hub, "bob", {"profile": "1gpu"}, server="gpu")
    assert r.status_code == 202, f"{r.status_code} {r.text}"
    place = wait_for(lambda: next((w["position"] for w in waiting(hub) if w["user"] == "bob"), None), 30,
                     "bob in the queue")
    assert place <= 2, waiting(hub)

    # a third waiting place is refused at once, saying why
    r = spawn(hub, "mallory", {"profile": "1gpu"}, server="one-more")
    if r.status_code == 202:  # the refusal came after the hub answered: it is in the progress stream
        wait_for(lambda: not user_model(hub, "mallory")["servers"].get("one-more", {}).get("pending"), 30,
                 "the refusal")
        message = hub.hub_request("GET", f"/users/mallory/servers/one-more/progress").text
    else:
        message = r.text
    assert "you already wait for 2 servers" in message.lower(), message

    # she stops one of her waiting servers: its place is free at once, and she may queue another
    first = next(w["server"] for w in waiting(hub) if w["user"] == "mallory")
    r = hub.hub_request("DELETE", f"/users/mallory/servers/{first}")
    assert r.status_code in (202, 204), r.text
    wait_for(lambda: first not in [w["server"] for w in waiting(hub) if w["user"] == "mallory"], 10,
             f"mallory/{first} to leave the queue")
    r = spawn(hub, "mallory", {"profile": "1gpu"}, server="instead")
    assert r.status_code == 202, f"{r.status_code} {r.text}"
    wait_for(lambda: "instead" in [w["server"] for w in waiting(hub) if w["user"] == "mallory"], 30,
             "mallory's new server in the queue")


def form_action(page: str) -> str:
    """Where the spawn page's form posts to; JupyterHub puts the xsrf token in that URL."""
    m = re.search(r'<form[^>]*action="([^"]*)"', page)
    assert m, page[:2000]
    action = html.unescape(m.group(1))
    assert re.search(r"[?&]_xsrf=[^&]+", action), action
    return action


def test_a_cross_site_get_starts_no_paid_server_but_the_forms_post_does(hub):
    hub.create_user("victim")
    session = hub.login("victim")
    url = f"{hub.url}/hub/spawn/victim/x?profile=1gpu"
    r = session.get(url, headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, timeout=60)
    assert r.status_code == 200, r.text[:500]
    # nothing started: no server, no allocation
    srv = user_model(hub, "victim").get("servers", {}).get("x")
    assert not srv or not (srv.get("pending") or srv.get("ready")), srv
    assert not [a for a in allocations(hub) if a["user"] == "victim"]
    # the page is the form, with the linked profile chosen
    assert re.search(r'<input type="radio" name="profile" value="1gpu" checked[ >]', r.text), r.text[:3000]
    assert not re.search(r'value="cpu" checked', r.text)

    assert "Confirm the start." in r.text and "costs tokens, so a link does not start it" in r.text

    # the form's own POST, with the xsrf token the form carries, starts it
    action = form_action(r.text)
    r = session.post(action if action.startswith("http") else f"{hub.url}{action}", data={"profile": "1gpu"},
                     timeout=60)
    assert r.status_code == 200, r.text[:500]
    wait_for(lambda: ready(hub, "victim", "x"), 60, "the server started by the form")
    [alloc] = [a for a in allocations(hub) if a["user"] == "victim"]
    assert alloc["server"] == "x"


def test_a_cross_site_get_of_a_free_cpu_profile_still_starts_it(hub):
    hub.create_user("linker")
    session = hub.login("linker")
    r = session.get(f"{hub.url}/hub/spawn/linker/c?profile=cpu", headers={"Sec-Fetch-Site": "cross-site"},
                    timeout=60)
    assert r.status_code == 200, r.text[:300]
    wait_for(lambda: ready(hub, "linker", "c"), 60, "the CPU-only server started by the link")
    assert not [a for a in allocations(hub) if a["user"] == "linker"]
