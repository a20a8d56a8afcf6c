"""Issue 39, points 7 and 8, through real HTTP against the in-process pages app: the admin
sees the queue (pool map, /metrics), grants read as what they did and are audited, the
grant form suggests names; "My GPU usage" starts its line at the account's opening, shows
the balance as the widget does, and speaks of bob as bob to an admin."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.common.metrics import ServiceMetrics
from tests.fixtures.manager import Clock, make_manager

from .inprocess import PREFIX, PagesService, attrs, field
from .test_pages_app import MODELS, NODES, StubHubAuth

A6000 = "NVIDIA RTX A6000"


@pytest.fixture
async def service(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4, "RTX 3090": 1}, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                           clock=Clock(), queue_enabled=True, queue_poll_timeout=7200)
    s = PagesService(manager, MODELS, metrics=ServiceMetrics(manager))
    s.context.hub_auth = StubHubAuth()
    yield s
    s.stop()


def _admit(m, user, gpus, model=None, server=""):
    """As the spawner asks: a profile's models (``model``), or any."""
    req = parse_request({"gpus": gpus, **({"models": [model]} if model else {})})
    return m.admission.admit(user, [], server, req, [model] if model else None)


def _wait(m, user, gpus, model=None):
    with pytest.raises(Refused):
        _admit(m, user, gpus, model)


async def _metrics(service) -> str:
    r = await AsyncHTTPClient().fetch(f"{service.origin}{PREFIX}metrics", headers={"Authorization": "token admin-api"},
                                      raise_error=False)
    assert r.code == 200, r.body
    return r.body.decode()


async def test_the_pool_map_and_metrics_show_who_waits_for_what(service):
    m = service.manager
    held = _admit(m, "alice", 2, "RTX A6000")
    _admit(m, "alice", 1, "RTX 3090", server="b")
    _wait(m, "bob", 1, "RTX A6000")
    m.clock.advance(60)
    _wait(m, "carol", 1)  # any model: counted under each
    page = (await service.client("admin-token").get("admin/pool")).body.decode()
    rows = attrs(page, "data-since=")
    assert [r["data-user"] for r in rows] == ["bob", "carol"]
    bob = rows[0]
    assert bob["data-since"] == "2025-03-03T09:00:00Z" and bob["data-eta"]
    table = page[page.index('data-gpupool="waiting"'):page.index("</table>", page.index('data-gpupool="waiting"'))]
    assert "1 GPU" in table and "rtx a6000" in table.lower() and "Mon 3 Mar 2025, 09:00 UTC" in table
    text = await _metrics(service)
    assert f'gpupool_queue_waiting{{model="{A6000}"}} 2.0' in text
    assert 'gpupool_queue_waiting{model="NVIDIA GeForce RTX 3090"} 1.0' in text
    assert "gpupool_queue_wait_seconds_count 0.0" in text
    # alice's two A6000s come back: bob, the first in line, starts after 30 minutes of waiting
    m.clock.advance(30 * 60 - 60)
    m.admission.release(held.id, "server stopped")
    assert _admit(m, "bob", 1, "RTX A6000").user == "bob"
    text = await _metrics(service)
    assert "gpupool_queue_wait_seconds_count 1.0" in text and "gpupool_queue_wait_seconds_sum 1800.0" in text
    assert 'gpupool_queue_wait_seconds_bucket{le="1800.0"} 1.0' in text
    assert 'gpupool_queue_wait_seconds_bucket{le="1200.0"} 0.0' in text
    # the second A6000 is reserved for carol until her spawner asks again: she no longer waits for one
    assert f'gpupool_queue_waiting{{model="{A6000}"}} 0.0' in text
    after = (await service.client("admin-token").get("admin/pool")).body.decode()
    assert [r["data-user"] for r in attrs(after, "data-since=")] == ["carol"]
    assert "GPUs reserved on node-a" in after


async def test_grants_read_as_what_they_did_and_appear_in_the_audit_log(service):
    m = service.manager
    for name in ("bob", "zoe"):
        m.accounts.ensure(name)
    admin = service.client("admin-token")
    page = (await admin.get("admin/grant")).body.decode()
    [names] = attrs(page, 'data-gpupool="account-names"')
    assert names["id"] == "gpupool-account-names" and 'list="gpupool-account-names"' in page
    assert re.findall(r'<option value="([^"]*)">', page) == ["bob", "zoe"]

    async def grant(amount, reason):
        form = (await admin.get("admin/grant")).body.decode()
        r = await admin.post("admin/grant", {"user": "bob", "amount": amount, "reason": reason,
                                             "key": field(form, "key"), "_xsrf": field(form, "_xsrf")})
        assert r.code == 201, r.body.decode()[-500:]
        [result] = attrs(r.body.decode(), 'data-gpupool="grant-result"')
        return r.body.decode()

    took = await grant("-105", "overdrawn by a bug")
    assert "Took back 105 tokens from bob" in took and "Granted" not in took
    given = await grant("2.5", "thanks")
    assert "Granted 2.5 tokens to bob" in given
    audit = (await admin.get("admin/audit?user=bob")).body.decode()
    assert [e["data-action"] for e in attrs(audit, "data-event=")] == ["grant", "grant"]
    assert "Granted 2.5 tokens to bob (by admin): thanks" in audit
    assert "Took back 105 tokens from bob (by admin): overdrawn by a bug" in audit
    # a replayed form grants once and audits once
    [first] = [e for e in m.ledger.audit.page(user="bob") if "Took back" in e.reason]
    assert first.detail["amount"] == "-105" and first.detail["actor"] == "admin"
    assert [e.amount for e in m.ledger.history("bob") if e.id == first.detail["entry"]] == [Decimal(-105)]


async def test_a_replayed_grant_writes_no_second_audit_event(service):
    m = service.manager
    m.accounts.ensure("bob")
    for _ in range(2):
        m.accounts.grant("bob", Decimal(-3), "same", "admin", "one-key")
    assert [e.reason for e in m.ledger.audit.page(user="bob")] == ["Took back 3 tokens from bob (by admin): same"]


async def test_the_balance_line_starts_on_the_day_the_account_opened(service):
    m = service.manager
    m.clock.advance(-5 * 86400)
    m.accounts.ensure("bob")  # opened five days ago
    m.clock.advance(5 * 86400)
    body = (await service.client("admin-token").get("admin/users/bob")).body.decode()
    points = attrs(body, 'class="point"')
    opened = (m.clock() - timedelta(days=5)).date()
    assert [p["data-date"] for p in points][0] == opened.isoformat() and len(points) == 6
    assert points[0]["data-value"] == "100.000"  # the initial grant, not 0 on the days before


async def test_an_admin_reads_bobs_page_as_bobs(service):
    m = service.manager
    m.accounts.ensure("bob")
    _admit(m, "bob", 1, "RTX A6000")
    body = (await service.client("admin-token").get("admin/users/bob")).body.decode()
    assert "What bob&#39;s GPUs did" in body and "bob reaches the floor" in body
    assert "You" not in body and "your" not in body
    own = (await service.client("bob-token").get("")).body.decode()
    assert "What your GPUs did" in own and "you reach the floor" in own


@pytest.mark.parametrize("amount, widget", [("-3.25", "\u22123.3"), ("2.05", "2.1"), ("-0.04", "0.0"),
                                            ("1234.56", "1234.6"), ("46", "46.0")])
async def test_the_page_shows_the_balance_as_the_widget_does(service, amount, widget):
    """The widget's rule (labextension/src/format.ts ``formatAmount``): one decimal, half away
    from zero, U+2212, never a negative zero; its vitest cases are these."""
    m = service.manager
    m.accounts.ensure("alice")
    m.accounts.grant("alice", Decimal(amount) - 100, "to the amount", "admin", f"k{amount}")
    body = (await service.client("alice-token").get("")).body.decode()
    [balance] = re.findall(r'data-gpupool="balance"[^>]*>([^<]*)<small>', body)
    assert balance.strip() == widget
