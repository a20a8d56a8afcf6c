"""gpupool-slurm with the wait queue on: a cancelled queued spawn leaves no entry, and a spawn that
waits because nodes are drained says so (issue 29.3, 29.4). The session's cluster, a hub of its own."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.fixtures.hub import wait_for
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)
from tests.slurm.test_spawner_hub import outside, slurm_config
from tests.spawner.conftest import allocations, set_balance, spawn, spawner_hub, stop_server, wait_spawned

pytestmark = [pytest.mark.integration, pytest.mark.loaded]


@pytest.fixture(scope="module")
def hub(tmp_path_factory, slurm_cluster):
    workdir = tmp_path_factory.mktemp("slurmqueue")
    extra = slurm_config(workdir, slurm_cluster) + "\nc.GPUPool.queue_enabled = True\n"
    yield from spawner_hub(tmp_path_factory, "slurmqueue", extra)


def queue_entries(hub) -> list[dict]:
    r = hub.service("GET", "/queue", hub.tester_token)
    r.raise_for_status()
    return r.json()["waiting"]


def test_a_cancelled_queued_spawn_leaves_no_entry_and_another_model_starts_at_once(hub, slurm, unix_account):
    """Issue 29.3: stopping a queued RTX 3090 spawn left its entry, and the next A6000 spawn of the
    same server inherited it and waited with A6000s free."""
    quin = unix_account("quin")
    set_balance(hub, quin, "100")
    slurm.submit_foreign_job("gpu-b", "gpu:rtx3090:2")
    slurm.submit_foreign_job("gpu-c", "gpu:rtx3090:1")
    wait_for(lambda: outside(hub) == {"gpu-b": [0, 1], "gpu-c": [1]}, 30, "the pool to see every RTX 3090 held")
    r = spawn(hub, quin, {"profile": "3090"})
    assert r.status_code == 202, r.text
    wait_for(lambda: [e["user"] for e in queue_entries(hub)] == [quin], 30, "the spawn to queue")
    stop_server(hub, quin)  # DELETE of the pending server
    wait_for(lambda: queue_entries(hub) == [], 10, "the cancelled spawn to leave the queue")
    t0 = time.monotonic()
    ok, message = wait_spawned(hub, quin, "", spawn(hub, quin, {"profile": "a6000"}))
    assert ok, message
    assert time.monotonic() - t0 < 15
    [alloc] = allocations(hub)
    assert {g["model"] for g in alloc["gpus"]} == {"NVIDIA RTX A6000"}
    assert queue_entries(hub) == []
    stop_server(hub, quin)


def test_a_spawn_that_waits_for_drained_nodes_names_the_drain(hub, slurm, unix_account):
    """Issue 29.4: a drained node made spawns queue without saying why."""
    dana = unix_account("dana")
    set_balance(hub, dana, "100")
    slurm.run(["scontrol", "update", "NodeName=gpu-a", "State=DRAIN", "Reason=maint"])
    slurm.submit_foreign_job("gpu-c", "gpu:a6000:1")
    wait_for(lambda: "gpu-a" in {n["node"] for n in hub.service("GET", "/pool", hub.tester_token).json()["nodes"]
                                 if n.get("unavailable")}, 30, "the pool to see gpu-a drained")
    # and gpu-c's A6000 held: else the spawn gets it, and waits in Slurm's queue instead
    wait_for(lambda: outside(hub).get("gpu-c") == [0], 30, "the pool to see gpu-c's A6000 held")
    r = spawn(hub, dana, {"profile": "a6000"})
    assert r.status_code == 202, r.text

    def said() -> str | None:
        for event in progress_snapshot(hub, dana):
            if "gpu-a is drained: maint" in event.get("message", ""):
                return event["message"]
        return None
    message = wait_for(said, 30, "the progress page to name the drain")
    assert "in the queue" in message, message
    stop_server(hub, dana)
    wait_for(lambda: queue_entries(hub) == [], 10, "the cancelled spawn to leave the queue")


def progress_snapshot(hub, user: str) -> list[dict]:
    """The progress events a pending spawn has sent so far (the stream read for a moment)."""
    events = []
    try:
        with hub.hub_request("GET", f"/users/{user}/server/progress", stream=True, timeout=3) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if "queue" in events[-1].get("message", ""):
                        break
    except requests.RequestException:
        pass
    return events

