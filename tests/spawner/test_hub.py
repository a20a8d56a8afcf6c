"""GPUPoolSpawner in a real JupyterHub (configurable-http-proxy, the gpupool service, real processes)."""

from __future__ import annotations

import html
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.spawner.conftest import (
    allocations,
    proc_environ,
    progress_events,
    q,
    server_info,
    set_balance,
    spawn,
    start_ok,
    stop_server,
    user_model,
    wait_spawned,
)

pytestmark = [pytest.mark.integration, pytest.mark.loaded]


def gpu_set(alloc):
    return {(alloc["node"], g["index"]) for g in alloc["gpus"]}


# ------------------------------------------------------------ accepted spawns


def test_gpu_profile_starts_with_its_gpus_and_stop_frees_them(hub):
    info = start_ok(hub, "alice", {"profile": "2x3090"})
    [alloc] = [a for a in allocations(hub) if a["user"] == "alice"]
    uuids = ",".join(g["uuid"] for g in alloc["gpus"])
    assert alloc["node"] == "node-a" and sorted(g["index"] for g in alloc["gpus"]) in ([0, 3], [1, 2])
    # what the running process actually got, via the proxy and via /proc
    env = info["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == uuids and env["NVIDIA_VISIBLE_DEVICES"] == uuids
    assert env["GPUPOOL_API_URL"] == f"http://127.0.0.1:{hub.service_port}/services/gpupool/api/v1"
    assert env["GPUPOOL_ALLOCATION"] == alloc["id"] and env["GPUPOOL_PROFILE"] == "2x3090"
    assert env["CPU_LIMIT"] == "4.0" and env["MEM_LIMIT"] == str(8 * 2**30)
    assert proc_environ(info["pid"])["CUDA_VISIBLE_DEVICES"] == uuids
    # the allocation id is in the server's state, where the service's reconcile job reads it
    state = user_model(hub, "alice")["servers"][""]["state"]
    assert state["gpupool_allocation"] == alloc["id"] and state["pid"] == info["pid"]
    stop_server(hub, "alice")
    assert not [a for a in allocations(hub) if a["user"] == "alice"]
    with pytest.raises(OSError):
        os.kill(info["pid"], 0)


def test_progress_says_where_the_server_landed(hub):
    # slow-* users pass a 2.5 s pre-spawn hook, so the stream is open before start()
    hub.create_user("slow-pat")
    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(spawn, hub, "slow-pat", {"profile": "2x3090"})
        deadline = time.monotonic() + 10
        while not user_model(hub, "slow-pat").get("servers", {}).get("", {}).get("pending"):
            assert time.monotonic() < deadline and not request.done(), "spawn never became pending"
            time.sleep(0.1)
        events = progress_events(hub, "slow-pat")
        assert request.result().status_code in (201, 202)
    messages = [e["message"] for e in events]
    landed = [m for m in messages if m.startswith("GPUs allocated:")]
    assert landed, messages
    assert re.search(r"node-a, GPUs (0\+3|1\+2) joined by NVLink .*, 2(\.000)? tokens/h", landed[0]), landed[0]
    assert events[-1].get("ready"), events


def test_cpu_only_profile_needs_no_gpu(hub):
    info = start_ok(hub, "carl", {"profile": "cpu"})
    assert info["env"]["CUDA_VISIBLE_DEVICES"] == "" and info["env"]["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert not [a for a in allocations(hub) if a["user"] == "carl"]
    state = user_model(hub, "carl")["servers"][""]["state"]
    assert "gpupool_allocation" not in state


def test_fraction_and_user_chosen_count(hub):
    quarter = start_ok(hub, "fran", {"profile": "quarter"})
    three = start_ok(hub, "fran", {"profile": "a6000", "gpus": 3}, server="big")
    mine = {a["server"]: a for a in allocations(hub) if a["user"] == "fran"}
    assert [g["fraction"] for g in mine[""]["gpus"]] == ["0.250"]
    assert len(mine["big"]["gpus"]) == 3 and mine["big"]["node"] == "node-b"
    assert len(three["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 3
    assert quarter["env"]["CUDA_VISIBLE_DEVICES"] == mine[""]["gpus"][0]["uuid"]


def test_named_servers_each_hold_their_own_allocation(hub):
    a = start_ok(hub, "nina", {"profile": "1gpu"}, server="one")
    b = start_ok(hub, "nina", {"profile": "1gpu"}, server="two")
    mine = {x["server"]: x for x in allocations(hub) if x["user"] == "nina"}
    assert set(mine) == {"one", "two"} and mine["one"]["id"] != mine["two"]["id"]
    assert not gpu_set(mine["one"]) & gpu_set(mine["two"])
    assert a["env"]["CUDA_VISIBLE_DEVICES"] != b["env"]["CUDA_VISIBLE_DEVICES"]
    servers = user_model(hub, "nina")["servers"]
    assert servers["one"]["state"]["gpupool_allocation"] == mine["one"]["id"]
    assert servers["two"]["state"]["gpupool_allocation"] == mine["two"]["id"]
    stop_server(hub, "nina", "one")
    left = [x for x in allocations(hub) if x["user"] == "nina"]
    assert [x["id"] for x in left] == [mine["two"]["id"]]


def test_restart_with_another_profile_releases_the_old_allocation(hub):
    start_ok(hub, "rita", {"profile": "1gpu"})
    first = [a for a in allocations(hub) if a["user"] == "rita"]
    stop_server(hub, "rita")
    info = start_ok(hub, "rita", {"profile": "2x3090"})
    now = [a for a in allocations(hub) if a["user"] == "rita"]
    assert len(now) == 1 and now[0]["id"] != first[0]["id"] and len(now[0]["gpus"]) == 2
    assert info["env"]["GPUPOOL_ALLOCATION"] == now[0]["id"]


def test_poll_releases_gpus_when_the_server_dies(hub):
    info = start_ok(hub, "dora", {"profile": "1gpu"})
    assert [a for a in allocations(hub) if a["user"] == "dora"]
    os.kill(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and [a for a in allocations(hub) if a["user"] == "dora"]:
        time.sleep(0.3)
    assert not [a for a in allocations(hub) if a["user"] == "dora"], "poll did not release the GPUs"


# ------------------------------------------------------------------ refusals


def test_options_form_shows_prices_balance_and_marks_unaffordable(hub):
    set_balance(hub, "olga", "-8.5")
    session = hub.login("olga")
    page = session.get(f"{hub.url}/hub/spawn", timeout=30)
    assert page.status_code == 200
    raw = page.content.decode()
    text = html.unescape(re.sub(r"<[^>]+>", "", raw))
    assert "Your balance: \u22128.5 tokens (GPU servers stop at \u221210)" in text
    # one 3090 (1 token/h) is affordable down to the floor, two (2 tokens/h) are not
    one = re.search(r'<div class="([^"]*)" data-profile="1gpu" data-affordable="(\w+)"', raw)
    two = re.search(r'<div class="([^"]*)" data-profile="2x3090" data-affordable="(\w+)"', raw)
    assert one.group(2) == "true" and "unaffordable" not in one.group(1)
    assert two.group(2) == "false" and "gpupool-unaffordable" in two.group(1)
    assert "2 tokens/h" in text and "2 × NVIDIA GeForce RTX 3090" in text
    assert "1–4 tokens/h" in text and "NVIDIA GeForce RTX 3090: 1, NVIDIA RTX A6000: 4" in text
    assert "Your balance buys 1.5 h above the floor" in text  # (balance - floor) / 1 token/h
    assert "no such GPU in this pool" in text  # the H100 profile
    assert "Not enough tokens to start this profile: it needs 2 tokens above your floor for its first 1 h" in text


def test_unaffordable_profile_refused_on_the_spawn_page(hub):
    """Fast path: the refusal comes back within the spawn POST and is shown with the form."""
    set_balance(hub, "ursula", "-9")
    session = hub.login("ursula")
    r = session.post(f"{hub.url}/hub/spawn", data={"profile": "2x3090", "_xsrf": session.xsrf}, timeout=60)
    text = html.unescape(r.content.decode())
    assert r.status_code == 403, text[:500]
    assert "Not enough tokens: your balance is \u22129 and this server costs 2 tokens/h" in text
    assert "With the daily credits you can start it from" in text
    assert 'class="spawn-error-msg' in r.text
    assert not [a for a in allocations(hub) if a["user"] == "ursula"]


def test_unaffordable_profile_refused_on_the_progress_page(hub):
    """Slow path: the spawn page has already redirected to the progress page when the pool says no."""
    set_balance(hub, "slow-sam", "-9")
    session = hub.login("slow-sam")
    r = session.post(f"{hub.url}/hub/spawn", data={"profile": "2x3090", "_xsrf": session.xsrf},
                     allow_redirects=False, timeout=60)
    assert r.status_code == 302 and "/hub/spawn-pending/slow-sam" in r.headers["Location"], r.status_code
    events = progress_events(hub, "slow-sam")
    assert events[-1]["failed"], events
    assert "Not enough tokens: your balance is \u22129" in events[-1]["message"]
    assert "daily credits" in events[-1]["message"]
    assert "Not enough tokens" in events[-1]["html_message"]
    assert any(e["message"].startswith("Asking the GPU pool for 2 GPUs") for e in events[:-1]), events
    # and the progress page, loaded again after the failure, shows it too
    page = session.get(f"{hub.url}{r.headers['Location']}", timeout=30)
    assert "Not enough tokens: your balance is \u22129" in html.unescape(page.content.decode())


def test_model_unavailable_and_no_capacity_refusals(hub):
    r = spawn(hub, "mona", {"profile": "h100"})
    assert r.status_code == 400 and "No GPU of model H100 exists in this pool" in r.json()["message"], r.text
    start_ok(hub, "mona", {"profile": "4x3090"})
    r = spawn(hub, "mona", {"profile": "2x3090"}, server="more")
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert message.startswith("No capacity for 2 GPUs") and "Free now:" in message


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"profile": "no-such"}, "unknown profile 'no-such'; choose one of ['cpu', '1gpu'"),
        ({"profile": 5}, "'profile' must be a profile name (string), got 5"),
        ({"profile": ["1gpu"]}, "'profile' must be a profile name"),
        ({"profile": "a6000", "gpus": -1}, "'gpus' for profile 'a6000' must be 1 to 4, got -1"),
        ({"profile": "a6000", "gpus": 10**9}, "must be 1 to 4, got 1000000000"),
        ({"profile": "a6000", "gpus": "2"}, "'gpus' must be a whole number, got '2'"),
        ({"profile": "a6000", "gpus": 2.5}, "'gpus' must be a whole number"),
        ({"profile": "1gpu", "gpus": 3}, "'gpus' for profile '1gpu' must be 1, got 3"),
        ({"profile": "1gpu", "image": "evil"}, "unknown option(s) ['image']"),
    ],
)
def test_invalid_user_options_are_400(hub, options, needle):
    r = spawn(hub, "ivan", options)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert message.startswith("Invalid user options: ") and needle in message, message
    assert not [a for a in allocations(hub) if a["user"] == "ivan"]


# --------------------------------------------------------------- concurrency


def test_30_concurrent_spawns_on_8_gpus_never_share_a_gpu(hub):
    users = [f"crowd{i:02d}" for i in range(30)]
    for name in users:
        hub.create_user(name)

    def one(name):
        r = hub.hub_request("POST", f"/users/{q(name)}/server", json={"user_options": {"profile": "1gpu"}})
        return name, wait_spawned(hub, name, "", r)

    with ThreadPoolExecutor(30) as pool:
        outcomes = dict(pool.map(one, users))
    started = [n for n, (ok, _) in outcomes.items() if ok]
    refused = {n: msg for n, (ok, msg) in outcomes.items() if not ok}
    assert len(started) == 8, (started, refused)
    assert all(msg.startswith("No capacity for 1 GPU") or "No capacity for 1 GPU" in msg
               for msg in refused.values()), refused
    held = [a for a in allocations(hub) if a["user"].startswith("crowd")]
    assert sorted(a["user"] for a in held) == sorted(started)
    seen = [gpu for a in held for gpu in gpu_set(a)]
    assert len(seen) == len(set(seen)) == 8
    # and the processes themselves see disjoint GPUs
    uuids = [server_info(hub, n)["env"]["CUDA_VISIBLE_DEVICES"] for n in started]
    assert len(set(uuids)) == 8 and all("," not in u and u for u in uuids)


# ------------------------------------------------------------------- restart


def test_hub_restart_keeps_running_servers_and_their_allocations(hub):
    info = start_ok(hub, "hana", {"profile": "2x3090"})
    [before] = [a for a in allocations(hub) if a["user"] == "hana"]
    hub.stop(keep_servers=True)
    hub.start()
    # the server survived (cleanup_servers = False), with its GPUs and its state
    assert server_info(hub, "hana")["pid"] == info["pid"]
    [after] = [a for a in allocations(hub) if a["user"] == "hana"]
    assert after["id"] == before["id"] and gpu_set(after) == gpu_set(before)
    assert user_model(hub, "hana")["servers"][""]["state"]["gpupool_allocation"] == before["id"]
    # the restored allocation still counts: its GPUs go to nobody else
    r = spawn(hub, "hugo", {"profile": "4x3090"})
    assert r.status_code == 503 and "No capacity" in r.json()["message"], r.text
    # and stopping after the restart frees them
    stop_server(hub, "hana")
    assert not [a for a in allocations(hub) if a["user"] == "hana"]
    start_ok(hub, "hugo", {"profile": "4x3090"})
