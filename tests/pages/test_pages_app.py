"""The pages in the real tornado app (``make_app``) with JupyterHub's own HubOAuth code:
login redirect, the one authorisation check, XSRF on forms (and not on the API),
the Content-Security-Policy, escaping, own-data-only, grants, accounts, verify."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpupool_hub.ledger import Posting
from tests.fixtures.manager import make_manager

from .inprocess import ADMIN_SCOPE, PREFIX, PagesService, attrs, field, user_model

A6000 = "NVIDIA RTX A6000"
NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": A6000}},
         {"name": "node-b", "cpu_milli": 8000, "memory_mib": 32768,
          "gpus": {"count": 1, "model": "NVIDIA GeForce RTX 3090"}}]
ODD = '<img src=x onerror="alert(1)">&co'

MODELS = {
    "alice-token": user_model("alice"),
    "bob-token": user_model("bob"),
    "admin-token": user_model("admin", admin=True),
    "odd-token": user_model(ODD),
    "service-token": {"kind": "service", "name": "tester", "scopes": ["access:services!service=gpupool", ADMIN_SCOPE]},
    "outsider-token": {"kind": "user", "name": "eve", "groups": [], "scopes": ["read:users:name!user=eve"]},
}


class StubHubAuth:
    """The API's token check (Authorization header), for the API-keeps-working test."""

    async def user_for_token(self, token, sync=False):
        return {"admin-api": {"kind": "user", "name": "admin", "scopes": [ADMIN_SCOPE]}}.get(token)


@pytest.fixture
async def service(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4, "RTX 3090": 1}, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    s = PagesService(manager, MODELS)
    s.context.hub_auth = StubHubAuth()
    yield s
    s.stop()


async def test_anonymous_visitors_are_sent_to_the_hub_oauth_login(service):
    for path in ("", "admin/pool", "me/history.csv"):
        r = await service.client(None).get(path)
        assert r.code == 302, path
        assert r.headers["Location"].startswith("/hub/api/oauth2/authorize?client_id=service-gpupool")
        assert "state=" in r.headers["Location"] and "code_challenge=" in r.headers["Location"]


async def test_admin_pages_need_the_admin_scope_and_my_pages_need_a_user(service):
    alice, admin = service.client("alice-token"), service.client("admin-token")
    for path in ("admin/pool", "admin/accounts", "admin/grant", "admin/teams", "admin/audit", "admin/ledger",
                 "admin/users/bob", "admin/users/bob/history.csv"):
        r = await alice.get(path)
        assert r.code == 403, path
        assert "needs the &#39;custom:gpupool:admin&#39; scope" in r.body.decode(), path
        assert (await admin.get(path)).code in (200, 404), path
    assert (await alice.get("")).code == 200
    assert (await admin.get("")).code == 200  # admins are users too
    service_page = await service.client("service-token").get("")
    assert service_page.code == 403 and "own usage" in service_page.body.decode()
    assert (await service.client("service-token").get("admin/pool")).code == 200
    # a token without access to the service is refused by JupyterHub's own check
    assert (await service.client("outsider-token").get("")).code == 403


async def test_every_page_sends_a_strict_content_security_policy_and_no_inline_script(service):
    admin = service.client("admin-token")
    for path in ("", "admin/pool", "admin/accounts", "admin/grant", "admin/teams", "admin/audit", "admin/ledger",
                 "admin/users/admin", "admin/nowhere"):
        r = await admin.get(path)
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert r.headers["Cache-Control"] == "no-store"
        body = r.body.decode()
        assert " style=" not in body and "<style" not in body, path
        # scripts only as files of the service's own (localtime.js: dates in the viewer's zone), never inline
        tags = re.findall(r"<script([^>]*)>(.*?)</script>", body, re.S)
        assert all(' src="/services/gpupool/static/' in attrs and not inline for attrs, inline in tags), path
        assert body.count("<script") == len(tags) == 1, path
    js = await admin.get("static/localtime.js?v=1")
    assert js.code == 200 and "data-gpupool-time" in js.body.decode()
    css = await admin.get("static/pages.css?v=1")
    assert css.code == 200 and "prefers-color-scheme: dark" in css.body.decode()
    assert "max-age" in css.headers["Cache-Control"]


async def test_values_are_escaped_everywhere(service):
    m = service.manager
    m.accounts.ensure(ODD)
    m.accounts.grant(ODD, Decimal(1), "<script>alert('r')</script>", "admin", "k1")
    own = (await service.client("odd-token").get("")).body.decode()
    admin = service.client("admin-token")
    accounts = (await admin.get("admin/accounts")).body.decode()
    for body in (own, accounts):
        assert "<img src=x" not in body and "<script>alert" not in body
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;co" in body
    assert "&lt;script&gt;alert(&#39;r&#39;)&lt;/script&gt;" in own
    # the name is one URL segment in links
    assert 'href="/services/gpupool/admin/users/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E%26co"' in accounts


async def test_users_see_only_their_own_data_whatever_the_url_says(service):
    m = service.manager
    m.accounts.ensure("bob")
    m.accounts.grant("bob", Decimal(7), "bob only", "admin", "bob-1")
    alice = service.client("alice-token")
    for path in ("?user=bob", "?name=bob&days=90", "me/history.csv?user=bob"):
        r = await alice.get(path)
        assert r.code == 200, path
        assert "bob only" not in r.body.decode(), path
    assert (await alice.get("admin/users/bob")).code == 403
    r = await alice.get("me/history.csv")
    rows = list(csv.DictReader(io.StringIO(r.body.decode())))
    assert r.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in r.headers["Content-Disposition"]
    assert rows and all(row["reason"] != "bob only" for row in rows)
    assert [row["kind"] for row in rows] == ["grant"]  # alice's initial grant, nothing of bob's


async def test_usage_page_numbers_match_the_ledger_and_the_me_view(service):
    m = service.manager
    m.accounts.ensure("alice")
    now = m.clock()
    for i in range(60):  # history paging: 61 entries, pages of 50
        m.ledger.post(Posting("alice", "debit", Decimal("-0.25"), f"d{i}", model=A6000), now=now)
    with m.ledger.db.engine.begin() as conn:  # opened 40 days ago: the line spans every day of 30, 41 of 90
        conn.exec_driver_sql("UPDATE gpupool_accounts SET created_at = ? WHERE name = 'alice'",
                             ((now - timedelta(days=40)).replace(tzinfo=None),))
    me = m.views.me("alice")
    alice = service.client("alice-token")
    body = (await alice.get("")).body.decode()
    [balance] = attrs(body, 'data-gpupool="balance"')
    assert balance["data-value"] == me["balance"] == "85.000"
    points = attrs(body, 'class="point"')
    assert len(points) == 30 and points[-1]["data-value"] == "85.000"
    [credit] = attrs(body, 'class="marker credit"')
    [debit] = attrs(body, 'class="marker debit"')
    assert (credit["data-value"], debit["data-value"]) == ("100.000", "-15.000")
    [bar] = attrs(body, 'data-model=')
    assert (bar["data-model"], bar["data-value"]) == (A6000, "15.000")
    assert len(attrs(body, "data-entry=")) == 50
    [older] = attrs(body, 'data-gpupool="older"')
    page2 = (await alice.get(older["href"].replace("&amp;", "&").removeprefix(PREFIX))).body.decode()
    assert len(attrs(page2, "data-entry=")) == 11
    assert len(attrs((await alice.get("?days=90")).body.decode(), 'class="point"')) == 41
    assert (await alice.get("?days=7")).code == 400


async def test_forms_need_the_xsrf_field_but_the_json_api_does_not(service):
    service.manager.accounts.ensure("alice")
    admin = service.client("admin-token")
    page = (await admin.get("admin/grant")).body.decode()
    form = {"user": "alice", "amount": "5", "reason": "xsrf test", "key": field(page, "key")}
    refused = await admin.post("admin/grant", form)
    assert refused.code == 403 and "_xsrf" in refused.body.decode()
    wrong = await admin.post("admin/grant", {**form, "_xsrf": "not-the-token"})
    assert wrong.code == 403
    assert not _granted(service, "alice", "xsrf test")
    ok = await admin.post("admin/grant", {**form, "_xsrf": field(page, "_xsrf")})
    assert ok.code == 201, ok.body.decode()[-500:]
    # the token-authenticated API: no cookie, no _xsrf, still works
    r = await AsyncHTTPClient().fetch(
        f"{service.origin}{PREFIX}api/v1/users/alice/grant", method="POST", raise_error=False,
        headers={"Authorization": "token admin-api", "Content-Type": "application/json"},
        body=json.dumps({"amount": "1", "reason": "api"}))
    assert r.code == 201, r.body
    # and a page POST with an Authorization token (not a cookie) needs no _xsrf either
    bare = service.client(None)
    r = await bare.post("admin/ledger", {}, headers={"Authorization": "token admin-token"})
    assert r.code == 200 and 'data-ok="true"' in r.body.decode()


def _granted(service, user, reason):
    try:
        return [e for e in service.manager.ledger.history(user) if e.reason == reason]
    except Exception:
        return []


async def test_a_grant_form_grants_once_however_often_it_is_submitted(service):
    admin = service.client("admin-token")
    page = (await admin.get("admin/grant?user=carol")).body.decode()
    assert field(page, "user") == "carol"
    form = {"user": "carol", "amount": "25", "reason": "welcome", "key": field(page, "key"),
            "_xsrf": field(page, "_xsrf")}
    # carol never logged in: the ledger has no account; without a hub to ask, she is unknown
    unknown = await admin.post("admin/grant", form)
    assert unknown.code == 400 and "No user" in unknown.body.decode()

    async def hub_user(name):
        return {"name": name} if name == "carol" else None

    service.context.hub = type("Hub", (), {"user": staticmethod(hub_user)})()
    first, second = await admin.post("admin/grant", form), await admin.post("admin/grant", form)
    assert (first.code, second.code) == (201, 200)
    [r1], [r2] = attrs(first.body.decode(), "data-gpupool=\"grant-result\""), \
        attrs(second.body.decode(), "data-gpupool=\"grant-result\"")
    assert (r1["data-created"], r2["data-created"]) == ("true", "false") and r1["data-entry"] == r2["data-entry"]
    grants = [e for e in service.manager.ledger.history("carol") if e.reason == "welcome"]
    assert [(e.amount, e.actor) for e in grants] == [(Decimal(25), "admin")]
    assert service.manager.ledger.balance("carol") == Decimal(125)  # initial grant + 25
    # the same form with other content is refused, not granted
    conflict = await admin.post("admin/grant", {**form, "amount": "26"})
    assert conflict.code == 409
    # a new render is a new key: a new grant
    page2 = (await admin.get("admin/grant")).body.decode()
    assert field(page2, "key") != form["key"]
    bad = await admin.post("admin/grant", {**form, "key": field(page2, "key"), "reason": ""})
    assert bad.code == 400 and "needs a reason" in bad.body.decode()


async def test_accounts_search_sort_and_negative_filter(service):
    m = service.manager
    for name, amount in (("ann", -150), ("anton", 20), ("bea", -101), ("carl", 0)):
        m.accounts.ensure(name)
        m.accounts.grant(name, Decimal(amount), "setup", "admin", name) if amount else None
    admin = service.client("admin-token")

    async def names(query):
        body = (await admin.get("admin/accounts" + query)).body.decode()
        return [a["data-user"] for a in attrs(body, "data-balance=")]

    assert await names("") == ["ann", "anton", "bea", "carl"]
    assert await names("?q=AN") == ["ann", "anton"]
    assert await names("?sort=balance") == ["ann", "bea", "carl", "anton"]
    assert await names("?sort=-balance&negative=1") == ["bea", "ann"]
    assert await names("?q=%25") == []  # a LIKE wildcard is just a character
    assert (await admin.get("admin/accounts?sort=evil")).code == 400


async def test_pool_map_audit_teams_and_verify(service):
    from gpupool_hub.ledger import AuditEvent
    from gpupool_hub.service.core.admission import parse_request

    m = service.manager
    m.admission.admit("bob", [], "", parse_request({"gpus": 1, "models": ["RTX A6000"]}), ["RTX A6000"])
    m.admission.admit("carol", [], "x", parse_request({"gpu_fraction": 0.5, "models": ["RTX A6000"]}), ["RTX A6000"])
    m.ledger.audit.add(AuditEvent(at=m.clock(), user="bob", server="", action="warn", reason="negative <b>"))
    admin = service.client("admin-token")
    pool = (await admin.get("admin/pool")).body.decode()
    cells = {(c["data-node"], c["data-index"]): c["data-state"] for c in attrs(pool, 'data-gpupool="gpu"')}
    assert cells == {("node-a", "0"): "held", ("node-a", "1"): "shared", ("node-b", "0"): "free"}
    parts = {p["data-user"]: p["data-fraction"] for p in attrs(pool, "data-fraction=")}
    assert parts == {"bob": "1.000", "carol": "0.500"}
    audit = (await admin.get("admin/audit?user=bob")).body.decode()
    assert [e["data-action"] for e in attrs(audit, "data-event=")] == ["warn"] and "negative &lt;b&gt;" in audit
    assert 'data-gpupool="teams-off"' in (await admin.get("admin/teams")).body.decode()
    ledger_page = (await admin.get("admin/ledger")).body.decode()
    r = await admin.post("admin/ledger", {"_xsrf": field(ledger_page, "_xsrf")})
    [result] = attrs(r.body.decode(), 'data-gpupool="verify-result"')
    assert result["data-ok"] == "true" and int(result["data-accounts"]) == 2
    # a broken balance is reported
    with m.ledger.db.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE gpupool_accounts SET balance_milli = balance_milli + 1 WHERE name = 'bob'")
    r = await admin.post("admin/ledger", {"_xsrf": field(ledger_page, "_xsrf")})
    [result] = attrs(r.body.decode(), 'data-gpupool="verify-result"')
    assert result["data-ok"] == "false" and re.search(r"<td>bob</td>", r.body.decode())


async def test_pages_without_hub_oauth_answer_503_and_the_api_still_works(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4, "RTX 3090": 1})
    s = PagesService(manager, MODELS)
    s.context.page_auth = None
    try:
        r = await s.client(None).get("")
        assert r.code == 503 and "OAuth" in r.body.decode()
        r = await AsyncHTTPClient().fetch(f"{s.origin}{PREFIX}api/v1/", raise_error=False)
        assert r.code == 200
    finally:
        s.stop()


async def test_held_gpus_and_the_forecast_come_from_the_me_view(service):
    from gpupool_hub.service.core.admission import parse_request

    m = service.manager
    record = m.admission.admit("alice", [], "big", parse_request({"gpus": 2, "models": ["RTX A6000"]}),
                               ["RTX A6000"])
    me = m.views.me("alice")
    body = (await service.client("alice-token").get("")).body.decode()
    [row] = attrs(body, "data-allocation=")
    assert row["data-allocation"] == record.id
    assert "NVIDIA RTX A6000 #0, NVIDIA RTX A6000 #1" in body and "8/h" in body
    [burn] = attrs(body, 'data-gpupool="burn"')
    assert burn["data-value"] == me["burn_rate_per_hour"] == "8.000"
    # 100 tokens above a floor of -10 at 8/h: 13.75 h from now
    reach = (m.clock() + timedelta(seconds=me["time_to_floor_seconds"])).strftime("%a %H:%M")
    [forecast] = re.findall(r'data-gpupool="forecast">(.*?)</p>', body)
    assert re.sub("<[^>]+>", "", forecast) == \
        f"At \u22128/h you reach the floor (\u221210) on {reach} UTC: your GPU servers stop then."


async def test_admin_user_pages_take_any_name_quoted_once(service):
    from urllib.parse import quote

    m = service.manager
    for name in ("a%41b", "o'brien@lab.ü", ODD):
        m.accounts.ensure(name)
        m.accounts.grant(name, Decimal(3), f"for {name}", "admin", f"k-{name}")
        body = (await service.client("admin-token").get(f"admin/users/{quote(name, safe='')}")).body.decode()
        assert f"<h1>GPU usage of {html_escape(name)}</h1>" in body, name
        assert html_escape(f"for {name}") in body, name
    assert (await service.client("admin-token").get("admin/users/nobody")).code == 404


def html_escape(text):
    from markupsafe import escape

    return str(escape(text))


async def test_pool_map_shows_the_live_accuracy_of_wait_estimates(service):
    m = service.manager
    admin = service.client("admin-token")
    [line] = attrs((await admin.get("admin/pool")).body.decode(), 'data-gpupool="eta-accuracy"')
    assert line["data-starts"] == "0" and line["data-in-range"] == ""
    now = m.clock()
    # four waiting servers started: two inside the range they were shown, one late, and one
    # told "1–3 min" that started after 2 min 20 s (inside, 20 s off)
    for i, (low, mid, high, waited) in enumerate([(600, 900, 1200, 1000), (600, 900, 1200, 750),
                                                  (60, 120, 180, 600), (70, 120, 150, 140)]):
        m.ledger.queue.estimate_shown(f"e{i}", "bob", now - timedelta(seconds=waited), [low, mid, high], "history")
        m.ledger.queue.estimate_started(f"e{i}", now)
    page = (await admin.get("admin/pool")).body.decode()
    [line] = attrs(page, 'data-gpupool="eta-accuracy"')
    # the same measures as the replay's (eta.accuracy): long waits as a share, short ones in seconds
    assert line["data-starts"] == "4" and line["data-in-range"] == "0.75"
    assert line["data-median-error-long"] == "0.2" and line["data-median-error-short-s"] == "20.0"
    assert ("last 30 days: 75 % of starts inside the range, median error 20 % for waits of 5 min or more, "
            "20 s for shorter ones (4 starts)") in page
