"""The shipped ``jupyterhub_config.example.py`` end to end.

The hub runs from a wrapper that ``load_subconfig``s the example unchanged
(simulated pool, its prices and profiles, the ``gpupool-localprocess``
spawner running each server as its user's Unix account) and shortens the
debit interval to 5 s. A user (a real Unix account made for the test; the
server is the probe server) starts the priced ``2x3090`` profile through the
REST API; the usage debits appear in ``GET me/history`` (and in the service's
``gpupool_tokens_charged_total``) with the right model
and the price × GPU-time; stopping the server releases the allocation and the
charging stops with it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
import requests

from .conftest import EXAMPLE_CONFIG, spawn, stop_server, wait_for

pytestmark = pytest.mark.integration

MODEL = "NVIDIA GeForce RTX 3090"
PRICE = Decimal(1)  # c.GPUPool.prices["RTX 3090"] in the example, tokens per GPU-hour
GPUS = 2  # the 2x3090 profile
INTERVAL = 5  # seconds, the shortened debit_interval
MILLI = Decimal("0.001")


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def debits(hub, token: str) -> list[dict]:
    r = hub.service("GET", "/me/history?limit=500", token)
    assert r.status_code == 200, r.text
    return [e for e in r.json()["entries"] if e["kind"] == "debit"]


def test_example_config_charges_a_priced_profile(unix_users, probe_cmd, example_hub_factory):
    assert EXAMPLE_CONFIG.is_file()
    name = unix_users("alice")
    hub = example_hub_factory(debit_interval=INTERVAL, debit_check_interval=1, server_cmd=probe_cmd)
    hub.create_user(name)
    token = hub.token_for(name)

    me = hub.service("GET", "/me", token).json()
    start_balance = Decimal(me["balance"])
    assert me["allocations"] == [] and Decimal(me["burn_rate_per_hour"]) == 0

    server = spawn(hub, name, {"profile": "2x3090"})
    assert server["ready"]
    # the example's pool: the NVLink pair on node-3090, 2 tokens/h
    me = hub.service("GET", "/me", token).json()
    [alloc] = me["allocations"]
    assert alloc["node"] == "node-3090" and alloc["server"] == ""
    assert sorted(g["index"] for g in alloc["gpus"]) in ([0, 3], [1, 2])
    assert {g["model"] for g in alloc["gpus"]} == {MODEL}
    assert Decimal(alloc["price_per_hour"]) == PRICE * GPUS
    assert Decimal(me["burn_rate_per_hour"]) == PRICE * GPUS

    # A debit for a whole interval in which the GPUs were held: 2 GPUs × 5 s.
    def full_interval_debit():
        return [e for e in debits(hub, token) if Decimal(e["gpu_seconds"]) == GPUS * INTERVAL]

    [entry, *_] = wait_for(full_interval_debit, 4 * INTERVAL, "a debit for a full interval")
    assert entry["model"] == MODEL
    assert ts(entry["interval_end"]) - ts(entry["interval_start"]) == timedelta(seconds=INTERVAL)
    assert entry["reason"] == f"0.003 GPU-h of {MODEL}"
    # price × time: 10 GPU-s × 1 token/GPU-h = 0.00278 tokens; each debit is rounded to the
    # milli-token and the remainder carried to the next, so one debit is within a milli-token
    exact = GPUS * INTERVAL * PRICE / 3600
    assert abs(-Decimal(entry["amount"]) - exact) < MILLI, entry
    assert Decimal(entry["amount"]) < 0

    stop_server(hub, name)
    # the allocation is released: nothing held, nothing burning, the GPUs free again
    me = hub.service("GET", "/me", token).json()
    assert me["allocations"] == [] and Decimal(me["burn_rate_per_hour"]) == 0
    r = hub.service("GET", f"/allocations/{alloc['id']}", hub.spawner_token)
    assert r.status_code == 200, r.text
    record = r.json()["allocation"]
    assert record["released_at"] is not None
    r = hub.service("GET", "/allocations", hub.spawner_token)
    assert [a for a in r.json()["allocations"] if a["user"] == name] == []

    # Once the interval holding the release is charged, the debits add up to the time
    # the GPUs were held at the profile's price, and no more come.
    released = ts(record["released_at"])  # whole seconds, truncated
    held = released - ts(record["started_at"])
    assert held >= timedelta(seconds=INTERVAL)  # it held the GPUs for a whole interval

    def charged_past_release():
        last = hub.service("GET", "/me", token).json()["last_debit_at"]
        return last is not None and ts(last) > released

    wait_for(charged_past_release, 4 * INTERVAL, "the interval holding the release to be charged")
    entries = debits(hub, token)
    assert {e["model"] for e in entries} == {MODEL}
    assert all(ts(e["interval_start"]) <= released for e in entries), entries
    assert all(0 < Decimal(e["gpu_seconds"]) <= GPUS * INTERVAL for e in entries), entries
    charged = -sum(Decimal(e["amount"]) for e in entries)
    # exact up to the carried remainder (< half a milli-token) and the API's whole-second
    # timestamps (up to 1 s of 2 GPUs)
    expected = GPUS * PRICE * Decimal(held.total_seconds()) / 3600
    assert abs(charged - expected) <= MILLI / 2 + GPUS * PRICE / 3600, (charged, expected, entries)
    # and the balance moved by exactly the debits (no credit is due within the test)
    balance = Decimal(hub.service("GET", "/me", token).json()["balance"])
    assert balance == start_balance - charged
    # and the service's /metrics counted the same tokens (the Grafana panel "Tokens charged per
    # user per day" is its increase), once per debit written
    text = requests.get(f"{hub.url}/services/gpupool/metrics", timeout=30,
                        headers={"Authorization": f"token {hub.tester_token}"}).text
    [counted] = [line.split()[-1] for line in text.splitlines()
                 if line.startswith(f'gpupool_tokens_charged_total{{user="{name}"}} ')]
    assert float(counted) == pytest.approx(float(charged), abs=1e-9)
