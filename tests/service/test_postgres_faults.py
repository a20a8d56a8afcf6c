"""The service on a real PostgreSQL behind a real hub (issue 27, items 7 and 9): the
database going away is a 503 with Retry-After, not a 500, and everything works
again once it is back; long names and Idempotency-Keys get clean answers."""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import quote

import pytest

from gpupool_hub.ledger import Ledger
from tests.fixtures.hub import wait_for

pytestmark = pytest.mark.integration


def _hub_on(hub_factory, db_url: str):
    hub = hub_factory(f'c.GPUPool.db_url = "{db_url}"\n')
    return hub


def test_postgres_down_answers_503_with_retry_after_and_recovers(hub_factory, stoppable_postgres):
    db_url = stoppable_postgres.url + "/gpupool"
    hub = _hub_on(hub_factory, db_url)
    for name in ("alice", "bob"):
        hub.create_user(name)
    alice, bob = hub.token_for("alice"), hub.token_for("bob")
    grant = {"amount": "2", "reason": "while the database is away"}
    assert hub.service("GET", "/me", alice).status_code == 200

    stoppable_postgres.stop()
    try:
        answers = {
            "GET me": hub.service("GET", "/me", bob),  # bob's first request: nothing cached
            "grant": hub.service("POST", "/users/alice/grant", hub.tester_token, json=grant,
                                 headers={"Idempotency-Key": "down-1"}),
            "history": hub.service("GET", "/me/history", alice),
        }
        for what, r in answers.items():
            assert r.status_code == 503, (what, r.status_code, r.text)
            assert int(r.headers["Retry-After"]) >= 1, what
            assert r.json() == {"status": 503, "message": "the ledger database cannot be reached; nothing was "
                                                          "changed, try again in a few seconds"}, what
    finally:
        stoppable_postgres.start()

    r = wait_for(lambda: (r := hub.service("GET", "/me", bob)).status_code == 200 and r, 30, "GET me to work again")
    assert r.json()["user"] == "bob"
    r = hub.service("POST", "/users/alice/grant", hub.tester_token, json=grant, headers={"Idempotency-Key": "down-1"})
    assert r.status_code == 201, r.text  # the grant refused while down was not half-recorded
    ledger = Ledger(db_url)
    try:
        assert ledger.verify().ok
        assert sum(e.amount for e in ledger.history("alice") if e.reason == grant["reason"]) == Decimal(2)
    finally:
        ledger.close()


def test_long_names_and_idempotency_keys_get_clean_answers_on_postgres(hub_factory, postgres_url):
    name = "é" * 180  # percent-encoded in keys: 1080 characters, past the old 1024 column
    key = "é" * 200
    hub = _hub_on(hub_factory, postgres_url)
    hub.create_user(name)
    token = hub.token_for(name)
    for _ in range(2):
        r = hub.service("GET", "/me", token)
        assert r.status_code == 200, r.text
        assert r.json()["user"] == name
    path = f"/users/{quote(name, safe='')}/grant"
    body = {"amount": "3", "reason": "long key"}
    first = hub.service("POST", path, hub.tester_token, json=body, headers={"Idempotency-Key": key})
    again = hub.service("POST", path, hub.tester_token, json=body, headers={"Idempotency-Key": key})
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert again.json()["entry"]["id"] == first.json()["entry"]["id"]
    other = hub.service("POST", path, hub.tester_token, json={**body, "amount": "4"}, headers={"Idempotency-Key": key})
    assert other.status_code == 409, other.text
    me = hub.service("GET", "/me", token).json()
    assert Decimal(me["balance"]) == Decimal(first.json()["balance"])
    ledger = Ledger(postgres_url)
    try:
        assert ledger.verify().ok
    finally:
        ledger.close()
