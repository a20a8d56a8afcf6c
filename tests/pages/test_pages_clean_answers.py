"""Clean answers from the pages (issue 27, item 6): they read without the ledger's
write lock, so another process holding it neither fails "My GPU usage" nor slows
a grant; every integer in a page URL is checked as the API checks it; a 405 says
which methods work.

The real app (``make_app``) over a real SQLite ledger file, with the hub's login
stood in (``inprocess.py``); another process takes SQLite's write lock.
"""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal

import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.fixtures.manager import make_manager
from tests.fixtures.sqlite_lock import write_lock_held

from .inprocess import ADMIN_SCOPE, PREFIX, PagesService, user_model

NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": "NVIDIA RTX A6000"}}]
READERS = 8  # browsers reloading "My GPU usage" at once, as in the probe
WRITE_TIMEOUT = 1  # c.GPUPoolService.db_write_timeout of this service, seconds
BIG = "99999999999999999999"  # past 64 bits: SQLite cannot even compare it


class StubHubAuth:
    """The API's token check (Authorization header): one admin token."""

    async def user_for_token(self, token, sync=False):
        return {"admin-api": {"kind": "user", "name": "admin", "scopes": [ADMIN_SCOPE]}}.get(token)


@pytest.fixture
async def service(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4}, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                           busy_timeout=WRITE_TIMEOUT)
    models = {f"user{i}-token": user_model(f"user{i}") for i in range(READERS)}
    models["admin-token"] = user_model("admin", admin=True)
    s = PagesService(manager, models)
    s.context.hub_auth = StubHubAuth()
    s.db_path = tmp_path / "ledger.sqlite"
    yield s
    s.stop()


async def grant(service, key: str) -> tuple[int, dict[str, str], dict, float]:
    """An admin's grant of 5 to user0 through the API: (status, headers, body, seconds)."""
    started = time.monotonic()
    r = await AsyncHTTPClient().fetch(
        f"{service.origin}{PREFIX}api/v1/users/user0/grant", method="POST", raise_error=False, request_timeout=60,
        headers={"Authorization": "token admin-api", "Idempotency-Key": key, "Content-Type": "application/json"},
        body=json.dumps({"amount": "5", "reason": "under the lock"}))
    return r.code, dict(r.headers), json.loads(r.body), time.monotonic() - started


async def test_my_usage_answers_at_once_and_a_grant_503s_in_time_while_another_process_holds_the_lock(service):
    """The probe: while another process holds the write lock, eight users reloading
    "My GPU usage" got 500s after the busy timeout, and a grant waited 9.6 s for a
    reader thread (every one stuck in a page's BEGIN IMMEDIATE) and then succeeded.
    Now every page answers at once and the grant answers 503 + Retry-After within
    db_write_timeout; after the release the same grant goes through once."""
    browsers = [service.client(f"user{i}-token") for i in range(READERS)]
    admin = service.client("admin-token")
    for b in browsers:  # accounts opened and credited, as after any first visit
        assert (await b.get("")).code == 200
    before = service.manager.ledger.balance("user0")
    with write_lock_held(service.db_path):
        done = asyncio.Event()
        sent: list[float] = []
        latencies: list[float] = []

        async def reload(browser) -> None:
            while not done.is_set():
                t = time.monotonic()
                sent.append(t)
                r = await browser.get("")
                latencies.append(time.monotonic() - t)
                assert r.code == 200, r.body.decode()[-300:]

        reloading = asyncio.gather(*(reload(b) for b in browsers))
        while len(sent) < 2 * READERS:  # the pages are being reloaded: now the admin grants
            await asyncio.sleep(0.01)
        status, headers, body, waited = await grant(service, "during-the-lock")
        done.set()
        await reloading
        # the admin pages that only read answer too
        for path in ("admin/accounts", "admin/audit", "admin/users/user1", "me/history.csv"):
            t = time.monotonic()
            r = await (browsers[0] if path.startswith("me/") else admin).get(path)
            assert r.code == 200 and time.monotonic() - t < 1, (path, r.code)
    assert status == 503, body
    assert headers["Retry-After"] == str(WRITE_TIMEOUT)
    assert "busy" in body["message"] and "nothing was changed" in body["message"]
    assert WRITE_TIMEOUT - 0.1 < waited < WRITE_TIMEOUT + 1.0, waited
    assert len(latencies) >= 2 * READERS and max(latencies) < 1.0, sorted(latencies)[-5:]
    assert service.manager.ledger.balance("user0") == before  # nothing of the refused grant was kept
    status, _, body, _ = await grant(service, "during-the-lock")  # the client retries with the same key
    assert status == 201, body
    status, _, body, _ = await grant(service, "during-the-lock")
    assert status == 200 and body["created"] is False
    assert service.manager.ledger.balance("user0") == before + Decimal(5)


async def test_a_page_that_must_write_under_the_lock_says_busy_not_internal_error(service):
    """A first visit opens the account (a write): under the lock that is a 503 page
    with Retry-After once db_write_timeout has passed, never a 500."""
    with write_lock_held(service.db_path):
        t = time.monotonic()
        r = await service.client("user3-token").get("")
        waited = time.monotonic() - t
    assert r.code == 503 and r.headers["Retry-After"] == str(WRITE_TIMEOUT), r.code
    assert "busy" in r.body.decode() and r.headers["Content-Type"].startswith("text/html")
    assert waited < WRITE_TIMEOUT + 1.5, waited
    assert (await service.client("user3-token").get("")).code == 200


@pytest.mark.parametrize("path, who", [
    (f"?before={BIG}", "user0"),
    (f"?days={BIG}", "user0"),
    ("?before=0", "user0"),
    ("?before=1e3", "user0"),
    (f"admin/users/user0?before={BIG}", "admin"),
    (f"admin/audit?before={BIG}", "admin"),
    (f"admin/accounts?page={BIG}", "admin"),
    (f"admin/accounts?page={2**63 // 50 + 1}", "admin"),  # fits 64 bits, its offset does not
])
async def test_integers_in_page_urls_are_checked_like_the_apis(service, path, who):
    """The probe's ``?before=99999999999999999999`` gave 500 on "My GPU usage" and on
    three admin pages; now each is a 400 page that says what is wrong."""
    browser = service.client(f"{who}-token")
    for b in {browser, service.client("user0-token")}:  # the accounts exist: only the argument is wrong
        assert (await b.get("")).code == 200
    r = await browser.get(path)
    body = r.body.decode()
    assert r.code == 400, (path, r.code, body[-300:])
    assert r.headers["Content-Type"].startswith("text/html")
    assert "must be" in body and "Internal error" not in body


async def test_empty_page_arguments_still_mean_not_given(service):
    browser = service.client("admin-token")
    for path in ("?before=&days=", "admin/audit?before=", "admin/accounts?page="):
        assert (await browser.get(path)).code == 200, path


async def test_a_405_says_which_methods_work(service):
    """RFC 9110: a 405 carries ``Allow`` (the pages' and the API's)."""
    bare = service.client(None)
    r = await bare.post("admin/audit", {}, headers={"Authorization": "token admin-token"})
    assert r.code == 405 and r.headers["Allow"] == "GET"
    r = await bare.post("admin/ledger", {}, headers={"Authorization": "token admin-token"})
    assert r.code == 200  # GET and POST both work there
    r = await AsyncHTTPClient().fetch(f"{service.origin}{PREFIX}api/v1/me", method="PUT", body=b"{}",
                                      raise_error=False, headers={"Authorization": "token admin-api"})
    assert r.code == 405 and r.headers["Allow"] == "GET" and json.loads(r.body)["status"] == 405
