"""Money and safety (issue 12, items 7 and 10) with a real hub, the real service process and its database.

* 12.7: a spawn the spawner gave up on (the service paused with SIGSTOP past
  the spawner's request timeout) must not leave GPUs held and charged when the
  service resumes and processes the queued request: the spawner abandons the
  attempt by its key, and the allocation is released at its start.
* 12.10: a server stopped while the service was paused, or paused and then
  killed (the hub starts it again), is charged only until it stopped.

The hub runs tiny servers (``tiny_server.py``) with short timeouts (a 3 s
spawner request timeout, releases retried every 0.5 s) and 2 s debit
intervals; the reconcile job's grace is an hour, so anything released here
was released by the new mechanisms, not by the grace running out. An RTX 3090
costs 3600 tokens per hour here, one token per GPU-second, so that a debit
says to the milli-token how long the GPUs were charged.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import requests

from gpupool_hub.ledger import Ledger
from tests.fixtures.hub import wait_for
from tests.spawner.conftest import (
    allocations,
    q,
    service_pid,
    set_balance,
    spawn,
    spawner_hub,
    start_ok,
    stop_server,
    user_model,
    wait_spawned,
)

pytestmark = pytest.mark.integration

INTERVAL = 2  # seconds per debit interval
PER_GPU_SECOND = 1  # tokens: an RTX 3090 at 3600 tokens/h
EXTRA = f"""
c.GPUPool.prices = {{"RTX 3090": 3600, "RTX A6000": 4}}
c.GPUPoolSpawner.request_timeout = 3
c.GPUPoolSpawner.release_retry_interval = 0.5
c.GPUPoolSpawner.release_wait = 1
c.GPUPoolService.debit_interval = {INTERVAL}
c.GPUPoolService.debit_check_interval = 0.5
c.GPUPoolService.reconcile_interval = 3600
c.GPUPoolService.reconcile_grace = 3600
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # test_12_10 ("restarted") kills the service and waits for the hub to start it again: see Hub
    yield from spawner_hub(tmp_path_factory, "safetyhub", EXTRA, service_poll=1)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def user_allocations(hub, user: str) -> list:
    """Every allocation of ``user`` in the service's database, released ones included."""
    ledger = Ledger(f"sqlite:///{hub.workdir}/gpupool.sqlite")
    try:
        now = datetime.now(timezone.utc)
        return [a for a in ledger.allocations.overlapping(now - timedelta(days=1), now + timedelta(days=1))
                if a.user == user]
    finally:
        ledger.close()


def account(hub, user: str) -> dict:
    r = hub.service("GET", f"/users/{q(user)}", hub.spawner_token)
    r.raise_for_status()
    return r.json()


def debits(hub, user: str) -> list[dict]:
    r = hub.service("GET", f"/users/{q(user)}/history?limit=500", hub.tester_token)
    r.raise_for_status()
    return [e for e in r.json()["entries"] if e["kind"] == "debit"]


def charged_past(hub, user: str, moment: datetime) -> bool:
    """Whether the debit job has charged an interval that ends after ``moment`` (plus one interval)."""
    last = account(hub, user)["last_debit_at"]
    return last is not None and ts(last) > moment + timedelta(seconds=INTERVAL)


class Paused:
    """The service process stopped with SIGSTOP (its socket still accepts and queues requests)."""

    def __init__(self, hub) -> None:
        self.pid = service_pid(hub)
        self.resumed = False

    def __enter__(self) -> Paused:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def resume(self) -> None:
        if not self.resumed:
            self.resumed = True
            os.kill(self.pid, signal.SIGCONT)

    def __exit__(self, *exc: object) -> None:
        self.resume()


# ------------------------------------------------------------------ item 7


def test_12_7_abandoned_spawn_releases_its_allocation(hub):
    user = "abby"
    hub.create_user(user)
    with Paused(hub) as paused:
        response = spawn(hub, user, {"profile": "1gpu"})
        ok, message = wait_spawned(hub, user, "", response)
        assert not ok and "not reachable" in message, message
        assert not user_model(hub, user).get("servers", {}).get("")
        paused.resume()
    # The service now processes the POST it had queued, and the spawner's release by key.
    def released() -> list:
        held = user_allocations(hub, user)
        return held if held and all(a.released_at is not None for a in held) else []

    [alloc] = wait_for(released, 30, "the abandoned spawn's allocation to be released")
    assert alloc.released_at == alloc.created_at, alloc  # never charged
    assert "abandoned" in (alloc.release_reason or ""), alloc
    assert alloc.request.get("key"), alloc
    assert not [a for a in allocations(hub) if a["user"] == user]
    # and the debit job, past the time it was held, charges nothing for it
    wait_for(lambda: charged_past(hub, user, alloc.created_at), 30, "the debit job to pass the allocation")
    assert debits(hub, user) == []


def test_12_7_a_key_gets_one_allocation_and_a_released_key_is_refused(hub):
    hub.create_user("kim")
    body = {"user": "kim", "server": "k", "request": {"gpus": 1}, "key": "attempt-1"}
    first = hub.service("POST", "/allocations", hub.spawner_token, json=body)
    again = hub.service("POST", "/allocations", hub.spawner_token, json=body)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    alloc = first.json()["allocation"]
    assert again.json()["allocation"]["id"] == alloc["id"]
    gone = hub.service("DELETE", "/allocations/by-key/attempt-1", hub.spawner_token, params={"reason": "test"})
    assert gone.status_code == 200 and gone.json()["allocation"]["id"] == alloc["id"], gone.text
    released = gone.json()["allocation"]
    assert released["released_at"] == released["started_at"]  # never charged
    late = hub.service("POST", "/allocations", hub.spawner_token, json=body)
    assert late.status_code == 410 and late.json()["reason"] == "abandoned", late.text
    # a key nobody used yet: nothing to release, but its POST is refused from now on
    nothing = hub.service("DELETE", "/allocations/by-key/attempt-2", hub.spawner_token)
    assert nothing.status_code == 200 and nothing.json() == {"allocation": None}
    late = hub.service("POST", "/allocations", hub.spawner_token, json={**body, "key": "attempt-2"})
    assert late.status_code == 410, late.text
    # a new attempt of the same server under a new key gets GPUs again
    fresh = hub.service("POST", "/allocations", hub.spawner_token, json={**body, "key": "attempt-3"})
    assert fresh.status_code == 201 and fresh.json()["allocation"]["id"] != alloc["id"], fresh.text
    hub.service("DELETE", f"/allocations/{fresh.json()['allocation']['id']}", hub.spawner_token)


# ----------------------------------------------------------------- item 10


@pytest.mark.parametrize("outage", ["paused", "restarted"])
def test_12_10_server_stopped_while_the_service_is_down_is_charged_until_it_stopped(hub, outage):
    user = f"stan-{outage}"
    set_balance(hub, user, "100000")
    start_ok(hub, user, {"profile": "2x3090"})
    [alloc] = [a for a in allocations(hub) if a["user"] == user]
    started = ts(alloc["started_at"])
    wait_for(lambda: charged_past(hub, user, started), 30, "a debit while the server runs")

    with Paused(hub) as paused:
        before = datetime.now(timezone.utc)
        stop_server(hub, user)
        after = datetime.now(timezone.utc)
        # the service stays down for a few debit intervals after the stop
        wait_for(lambda: datetime.now(timezone.utc) > after + timedelta(seconds=3 * INTERVAL), 30,
                 "debit intervals to close while the service is down")
        if outage == "restarted":  # killed while paused: the hub notices (its poll) and starts it again
            os.kill(paused.pid, signal.SIGKILL)
            paused.resumed = True
    if outage == "restarted":
        wait_for(lambda: _new_service(hub, paused.pid), 90, "the hub to start the service again")

    def released() -> str | None:
        r = hub.service("GET", f"/allocations/{alloc['id']}", hub.spawner_token)
        return r.json()["allocation"]["released_at"] if r.status_code == 200 else None

    released_at = ts(wait_for(released, 60, "the allocation to be released"))
    # the charge ends when the server stopped (the API has whole seconds; the hub records the
    # stop after the spawner's stop, which waits up to release_wait = 1 s for the service)
    assert before - timedelta(seconds=1) <= released_at <= after + timedelta(seconds=1), (before, released_at, after)

    wait_for(lambda: charged_past(hub, user, released_at), 60, "the intervals after the stop to be charged")
    entries = debits(hub, user)
    assert entries and all(ts(e["interval_start"]) <= released_at for e in entries), entries
    # two GPUs at one token per GPU-second, from the start to the stop (whole seconds in the API)
    held = Decimal((released_at - started).total_seconds())
    charged = -sum(Decimal(e["amount"]) for e in entries)
    assert abs(charged - 2 * PER_GPU_SECOND * held) <= 2 * PER_GPU_SECOND + Decimal("0.002"), (charged, held, entries)
    assert Decimal(account(hub, user)["balance"]) == Decimal(100000) - charged


def _new_service(hub, old_pid: int) -> bool:
    try:
        pid = service_pid(hub)
    except AssertionError:
        return False
    if pid == old_pid:
        return False
    try:
        return requests.get(f"{hub.service_api}/", timeout=2).status_code == 200
    except requests.RequestException:
        return False
