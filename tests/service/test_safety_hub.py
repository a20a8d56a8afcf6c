"""Issue 12, "money and safety", in a real JupyterHub running the service over a
real SQLite ledger: each test is named for the item it guards."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from urllib.parse import quote

import pytest

from tests.fixtures.hub import DEMO_NODES, wait_for
from tests.fixtures.sqlite_lock import HOLD_LOCK  # another process holds the ledger's write lock

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

R2080 = "NVIDIA GeForce RTX 2080"
NODES = DEMO_NODES + [{"name": "node-c", "cpu_milli": 64000, "memory_mib": 262144,
                       "gpus": {"count": 8, "model": R2080}}]
WRITE_TIMEOUT = 2

EXTRA = f"""
c.GPUPool.nodes = {NODES!r}
c.GPUPoolService.db_write_timeout = {WRITE_TIMEOUT}
c.GPUPoolService.reconcile_interval = 3600
c.Culler.interval = 0.5
c.Culler.grace_period = 3600
c.Culler.pressure_allocated_fraction = 0.99
c.Culler.pressure_refusal_window = 600
c.GPUPool.queue_enabled = False  # test_12_11: a capacity refusal (not a place in the queue) puts the pool under pressure
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from tests.fixtures.hub import Hub, require_hub_binaries

    require_hub_binaries()
    hub = Hub(tmp_path_factory.mktemp("safety"), extra_config=EXTRA)
    hub.start()
    hub.tokens = {}
    yield hub
    hub.stop()


def user(hub, name: str) -> str:
    if name not in hub.tokens:
        hub.create_user(name)
        hub.tokens[name] = hub.token_for(name)
    return hub.tokens[name]


def me(hub, name: str) -> dict:
    r = hub.service("GET", "/me", user(hub, name))
    assert r.status_code == 200, r.text
    return r.json()


def grant(hub, name: str, amount: str, key: str | None = None):
    headers = {"Idempotency-Key": key} if key else {}
    return hub.service("POST", f"/users/{quote(name, safe='')}/grant", hub.tester_token,
                       json={"amount": amount, "reason": "test"}, headers=headers)


def set_balance(hub, name: str, target: str) -> None:
    balance = Decimal(me(hub, name)["balance"])
    if Decimal(target) != balance:
        r = grant(hub, name, str(Decimal(target) - balance))
        assert r.status_code == 201, r.text


def allocate(hub, name: str, server: str, request: dict):
    return hub.service("POST", "/allocations", hub.spawner_token,
                       json={"user": name, "server": server, "request": request})


# ------------------------------------------------------------------ item 3

def test_12_3_a_held_write_lock_freezes_nothing(hub):
    """While another process holds the ledger's write lock, a grant waits at most
    db_write_timeout and answers 503 with Retry-After; meanwhile another user's
    GET me (and their history, a database read) answers at once; once the lock
    is free, the same grant succeeds, exactly once."""
    me(hub, "hal")  # hal's account, credits and cached view exist, as for any lab user
    user(hub, "gil")
    assert grant(hub, "gil", "1", "gil-warm").status_code == 201
    before = Decimal(me(hub, "gil")["balance"])
    db = hub.workdir / "gpupool.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        latencies = []
        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            pending = pool.submit(grant, hub, "gil", "5", "gil-during-lock")
            while not pending.done() or len(latencies) < 4:
                for path in ("/me", "/me/history"):
                    t = time.monotonic()
                    r = hub.service("GET", path, user(hub, "hal"))
                    latencies.append(time.monotonic() - t)
                    assert r.status_code == 200, r.text
            busy = pending.result()
            waited = time.monotonic() - started
        assert busy.status_code == 503, busy.text
        assert busy.headers["Retry-After"] == str(WRITE_TIMEOUT)
        assert "busy" in busy.json()["message"]
        assert waited < WRITE_TIMEOUT + 1.5, waited
        assert max(latencies) < 1.0, latencies
    finally:
        holder.communicate("\n", timeout=10)
    assert holder.returncode == 0
    ok = grant(hub, "gil", "5", "gil-during-lock")
    assert ok.status_code == 201, ok.text
    assert Decimal(ok.json()["balance"]) == before + 5
    assert grant(hub, "gil", "5", "gil-during-lock").status_code == 200  # a replay, not a second grant


# ------------------------------------------------------------------ item 2

def test_12_2_five_named_2080_servers_at_minus_9_4(hub):
    """At -9.4 with a floor of -10, one 0.5 tokens/h server fits (0.5 <= 0.6 for an
    hour); a second does not, because the first one keeps costing."""
    set_balance(hub, "ann", "-9.4")
    answers = [allocate(hub, "ann", f"gpu{i}", {"gpus": 1, "models": ["RTX 2080"]}) for i in range(1, 6)]
    assert [r.status_code for r in answers] == [201, 409, 409, 409, 409], [r.text for r in answers]
    refusal = answers[1].json()
    assert refusal["reason"] == "insufficient_balance"
    assert "gpu1 (0.5/h)" in refusal["message"] and "floor of \u221210" in refusal["message"]
    assert refusal["details"]["held"] == [{"server": "gpu1", "price_per_hour": "0.500"}]
    view = me(hub, "ann")
    assert [a["server"] for a in view["allocations"]] == ["gpu1"] and view["burn_rate_per_hour"] == "0.500"


# ----------------------------------------------------------------- item 11

def cull_audit(hub, name: str) -> list[str]:
    """What culling did to ``name`` (the grants that set up each balance are audited too: left out)."""
    events = hub.service("GET", f"/audit?user={quote(name)}", hub.tester_token).json()["events"]
    return [e["action"] for e in events if e["action"] != "grant"][::-1]


def test_12_11_bobs_own_refusal_never_warns_bob(hub):
    """bob's second spawn is refused for lack of capacity. That refusal puts the pool
    under pressure for everyone else (carol, negative, is warned), never for bob."""
    for name in ("bob", "carol"):
        set_balance(hub, name, "100")
    assert allocate(hub, "bob", "", {"gpus": 1, "models": ["RTX A6000"]}).status_code == 201
    refused = allocate(hub, "bob", "more", {"gpus": 2, "models": ["RTX A6000"]})
    assert refused.status_code == 409 and refused.json()["reason"] == "no_capacity", refused.text
    assert allocate(hub, "carol", "", {"gpus": 1, "models": ["RTX 3090"]}).status_code == 201
    set_balance(hub, "bob", "-1")
    set_balance(hub, "carol", "-1")
    warning = wait_for(lambda: me(hub, "carol")["cull_warning"], 20, "carol's warning from bob's refusal")
    assert "refused" in warning["reason"]
    # a cull run that started after bob went negative: carol's top-up withdraws her warning
    set_balance(hub, "carol", "1")
    wait_for(lambda: cull_audit(hub, "carol")[-1:] == ["clear_warning"], 20, "carol's warning withdrawn")
    assert me(hub, "bob")["cull_warning"] is None
    assert cull_audit(hub, "bob") == []


# ------------------------------------------------------------------ item 4

def enforced(hub) -> list[str]:
    r = hub.service("GET", "/nodes/node-a/enforce", hub.tester_token)
    assert r.status_code == 200, r.text
    return r.json()["users"]


def test_12_4_enforcement_list_survives_a_service_restart(hub):
    """dora and eve reach the floor: their servers are stopped and the node agents
    stop their stray GPU processes. eve is topped up (off the list); the service
    restarts; dora is on the list at once, eve still off."""
    for name in ("dora", "eve"):
        set_balance(hub, name, "100")
        assert allocate(hub, name, "", {"gpus": 1, "models": ["RTX 3090"]}).status_code == 201
        set_balance(hub, name, "-10")
    wait_for(lambda: {"dora", "eve"} <= set(enforced(hub)), 20, "dora and eve on the enforcement list")
    assert cull_audit(hub, "dora") == ["stop_server"]
    set_balance(hub, "eve", "5")
    wait_for(lambda: "eve" not in enforced(hub), 20, "eve off the list after her top-up")
    hub.stop()
    hub.start()
    listed = enforced(hub)
    assert "dora" in listed and "eve" not in listed
