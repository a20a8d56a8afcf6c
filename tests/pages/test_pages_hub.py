"""The pages in a real hub, in headless Chromium.

A real JupyterHub (configurable-http-proxy, DummyAuthenticator) runs the
example configuration with the gpupool service; users log in through
``/hub/login`` and reach the service's pages through the hub's OAuth. The
numbers on the pages are checked against the service's JSON API, which reads
the same ledger.
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from tests.fixtures.hub import wait_for
from tests.labext.browser import hub_login

from .conftest import A6000, new_page, screenshot

pytestmark = pytest.mark.integration

PAGES = "/services/gpupool/"


def api(hub, who, method, path, **kw):
    token = hub.spawner_token if who == "spawner" else hub.tokens[who]
    r = hub.service(method, path, token, **kw)
    assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
    return r.json()


def history(hub, who):
    return api(hub, who, "GET", "/me/history?limit=500")["entries"]


def open_pages(page, hub, name, path=""):
    """Log in at the hub, then open a gpupool page (the hub's OAuth runs in between)."""
    hub_login(page, hub.url, name)
    page.goto(f"{hub.url}{PAGES}{path}", wait_until="domcontentloaded")
    assert page.url.startswith(f"{hub.url}{PAGES}{path}"), page.url
    assert page.locator("[data-gpupool=who]").inner_text() == name


def values(page, selector, attr="data-value"):
    return [page.locator(selector).nth(i).get_attribute(attr) for i in range(page.locator(selector).count())]


def test_alice_sees_her_chart_from_her_ledger_and_only_her_data_and_downloads_her_csv(pages_hub, chromium, tmp_path):
    from playwright.sync_api import expect

    hub = pages_hub
    api(hub, "admin", "POST", "/users/alice/grant", json={"amount": "12.5", "reason": "course credit"})
    api(hub, "admin", "POST", "/users/bob/grant", json={"amount": "7", "reason": "bob only"})
    # alice holds an A6000 for a few debit intervals (5 s each), then lets it go
    alloc = api(hub, "spawner", "POST", "/allocations",
                json={"user": "alice", "server": "", "request": {"gpus": 1, "models": ["RTX A6000"]}})["allocation"]
    today = datetime.now(timezone.utc).date().isoformat()
    wait_for(lambda: [e for e in history(hub, "alice") if e["kind"] == "debit" and e["created_at"][:10] == today],
             30, "a debit of alice's A6000 today")
    release = api(hub, "spawner", "DELETE", f"/allocations/{alloc['id']}")["allocation"]
    released = datetime.fromisoformat(release["released_at"].replace("Z", "+00:00"))
    # charging is done once an interval ending after the release is charged
    wait_for(lambda: (api(hub, "alice", "GET", "/me")["last_debit_at"] or "") >
             (released + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"), 30, "the last interval to be charged")
    me = api(hub, "alice", "GET", "/me")
    entries = history(hub, "alice")
    assert me["allocations"] == []

    page = new_page(chromium, height=1500)
    try:
        open_pages(page, hub, "alice")
        expect(page.locator("h1")).to_have_text("My GPU usage")
        assert page.locator("[data-gpupool=balance]").get_attribute("data-value") == me["balance"]
        # the chart: one point per day; today's point is the balance, a past day's the sum up to it
        points = page.locator("[data-gpupool=balance-chart] .point")
        assert points.count() == 30
        assert points.nth(29).get_attribute("data-date") == today
        assert points.nth(29).get_attribute("data-value") == me["balance"]
        ten_days_ago = datetime.now(timezone.utc).date() - timedelta(days=10)
        expected = sum((s["amount"] for s in hub.seeded if s["at"].date() <= ten_days_ago), Decimal(0))
        point = page.locator(f"[data-gpupool=balance-chart] .point[data-date='{ten_days_ago.isoformat()}']")
        assert Decimal(point.get_attribute("data-value")) == expected
        # today's markers: the credits and the debits of today's entries
        todays = [Decimal(e["amount"]) for e in entries if e["created_at"][:10] == today]
        credit = page.locator(f"[data-gpupool=balance-chart] .marker.credit[data-date='{today}']")
        debit = page.locator(f"[data-gpupool=balance-chart] .marker.debit[data-date='{today}']")
        assert Decimal(credit.get_attribute("data-value")) == sum(a for a in todays if a > 0)
        assert Decimal(debit.get_attribute("data-value")) == sum(a for a in todays if a < 0)
        # spend per day by model: today's A6000 part is what the A6000 debits of today cost
        a6000 = page.locator(f"[data-gpupool=spend-chart] rect[data-date='{today}'][data-model='{A6000}']")
        assert Decimal(a6000.get_attribute("data-value")) == -sum(
            Decimal(e["amount"]) for e in entries
            if e["kind"] == "debit" and e["model"] == A6000 and (e["interval_start"] or "")[:10] == today)
        expect(page.locator("[data-gpupool=forecast]")).to_contain_text("Nothing is charging now")
        expect(page.locator("[data-gpupool=history]")).to_contain_text("course credit")
        expect(page.locator("[data-gpupool=history] tbody tr")).to_have_count(50)
        assert not page.gpupool_errors, page.gpupool_errors
        screenshot(page, "my-usage.png", full_page=False)  # the top: charts and the latest entries

        # nothing in a URL shows bob's data to alice
        for path in ("?user=bob", "?name=bob&days=90"):
            page.goto(f"{hub.url}{PAGES}{path}", wait_until="domcontentloaded")
            assert page.locator("[data-gpupool=who]").inner_text() == "alice"
            assert "bob only" not in page.content()
            assert page.locator("[data-gpupool=balance]").get_attribute("data-value") == me["balance"]
        for path in ("admin/users/bob", "admin/users/bob/history.csv", "admin/accounts?q=bob", "admin/pool"):
            response = page.goto(f"{hub.url}{PAGES}{path}", wait_until="domcontentloaded")
            assert response.status == 403, path
            assert "bob only" not in page.content()
        # the JSON API never honours the login cookie
        response = page.goto(f"{hub.url}{PAGES}api/v1/users/bob/history", wait_until="domcontentloaded")
        assert response.status == 401

        # her CSV: every entry of hers, none of bob's
        page.goto(f"{hub.url}{PAGES}", wait_until="domcontentloaded")
        with page.expect_download() as download:
            page.click("[data-gpupool=csv]")
        target = tmp_path / "alice.csv"
        download.value.save_as(target)
        rows = list(csv.DictReader(target.open(newline="")))
        assert {int(r["id"]) for r in rows} == {e["id"] for e in history(hub, "alice")}
        assert [r["amount"] for r in rows] == [e["amount"] for e in history(hub, "alice")]
        assert "bob only" not in target.read_text()
    finally:
        page.context.close()


def test_my_usage_fits_a_phone(pages_hub, chromium):
    page = new_page(chromium, width=390, height=844, scheme="dark")
    try:
        open_pages(page, pages_hub, "alice")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width} px wide on a 390 px screen"
        assert page.locator("[data-gpupool=balance-chart]").bounding_box()["width"] <= 390
        screenshot(page, "my-usage-phone.png", full_page=False)
    finally:
        page.context.close()


def test_admin_grants_once_to_a_user_who_never_logged_in_despite_a_double_submit(pages_hub, chromium):
    from playwright.sync_api import expect

    hub = pages_hub
    hub.create_user("dave")  # in the hub, never logged in: no account in the ledger yet
    page = new_page(chromium)
    try:
        open_pages(page, hub, "admin", "admin/grant")
        form = page.locator("[data-gpupool=grant-form]")
        form.locator("input[name=user]").fill("dave")
        form.locator("input[name=amount]").fill("25")
        form.locator("input[name=reason]").fill("welcome to the course")
        fields = {name: form.locator(f"input[name={name}]").input_value() for name in ("user", "amount", "reason",
                                                                                      "key", "_xsrf")}
        form.locator("button[type=submit]").dblclick()
        result = page.locator("[data-gpupool=grant-result]")
        expect(result).to_contain_text("to dave")
        # the same form, sent twice more with the browser's cookies (a reload, a retry)
        for _ in range(2):
            again = page.request.post(f"{hub.url}{PAGES}admin/grant", form=fields)
            assert again.status == 200 and 'data-created="false"' in again.text(), again.status
        grants = [e for e in api(hub, "admin", "GET", "/users/dave/history")["entries"]
                  if e["reason"] == "welcome to the course"]
        assert [(e["amount"], e["actor"]) for e in grants] == [("25.000", "admin")]
        dave = api(hub, "admin", "GET", "/users/dave")
        assert Decimal(dave["balance"]) == Decimal(100 + 25)  # the example's initial grant, plus 25
        screenshot(page, "admin-grant.png")
        # without a reason, nothing is granted
        form.locator("input[name=user]").fill("dave")
        form.locator("input[name=amount]").fill("5")
        form.locator("button[type=submit]").click()
        expect(page.locator("input[name=reason]:invalid")).to_have_count(1)  # the browser refuses first
    finally:
        page.context.close()


def test_admin_sees_the_pool_map_with_held_gpus_and_verifies_the_ledger(pages_hub, chromium):
    from playwright.sync_api import expect

    hub = pages_hub
    held = api(hub, "spawner", "POST", "/allocations",
               json={"user": "bob", "server": "", "request": {"gpus": 2, "models": ["RTX 3090"]}})["allocation"]
    shared = api(hub, "spawner", "POST", "/allocations",
                 json={"user": "admin", "server": "half", "request": {"gpu_fraction": 0.5,
                                                                      "models": ["RTX A6000"]}})["allocation"]
    page = new_page(chromium)
    try:
        open_pages(page, hub, "admin", "admin/pool")
        nodes = values(page, "[data-gpupool=node]", "data-node")
        assert nodes == ["node-2080", "node-3090", "node-a6000"]  # the demo's three nodes
        assert page.locator("[data-gpupool=gpu]").count() == 8 + 4 + 2
        for g in held["gpus"]:
            cell = page.locator(f"[data-gpupool=gpu][data-node='node-3090'][data-index='{g['index']}']")
            assert cell.get_attribute("data-state") == "held"
            part = cell.locator("rect.part")
            assert part.get_attribute("data-user") == "bob" and part.get_attribute("data-fraction") == "1.000"
            assert part.get_attribute("fill").startswith("hsl(")
        [g] = shared["gpus"]
        half = page.locator(f"[data-gpupool=gpu][data-node='node-a6000'][data-index='{g['index']}']")
        assert half.get_attribute("data-state") == "shared"
        assert half.locator("rect.part").get_attribute("data-fraction") == "0.500"
        idle = [i for i in range(4) if i not in {g["index"] for g in held["gpus"]}]
        for i in idle:
            assert page.locator(f"[data-gpupool=gpu][data-node='node-3090'][data-index='{i}']").get_attribute(
                "data-state") == "free"
        expect(page.locator("[data-gpupool=holders]")).to_contain_text("bob · 2 GPU")
        assert not page.gpupool_errors, page.gpupool_errors
        screenshot(page, "admin-pool-map.png")

        page.goto(f"{hub.url}{PAGES}admin/ledger", wait_until="domcontentloaded")
        page.click("[data-gpupool=verify-form] button")
        result = page.locator("[data-gpupool=verify-result]")
        expect(result).to_have_attribute("data-ok", "true")
        assert int(result.get_attribute("data-accounts")) >= 3
        expect(result).to_contain_text("The ledger is consistent")
    finally:
        page.context.close()
        for alloc in (held, shared):
            api(hub, "spawner", "DELETE", f"/allocations/{alloc['id']}")


def test_the_pages_are_in_the_hub_services_menu(pages_hub, chromium):
    page = new_page(chromium)
    try:
        hub_login(page, pages_hub.url, "bob")
        page.goto(f"{pages_hub.url}/hub/home", wait_until="domcontentloaded")
        link = page.locator(f"a[href='{PAGES}']")
        assert link.count() >= 1, page.content()[:2000]
    finally:
        page.context.close()
