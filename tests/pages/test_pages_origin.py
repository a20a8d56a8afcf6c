"""Forms sent from another site are refused (issue 37, point 7): a POST to a page whose
``Origin`` is not the page's own, or whose ``Sec-Fetch-Site`` says another site, gets a
403 page and changes nothing, even with a valid ``_xsrf``; the pages' own forms, forms
behind a proxy that reports the public host, and command-line tools (neither header)
work as before.

The real app (``make_app``) on a loopback port over a real SQLite ledger, real HTTP
requests, and a real Chromium submitting a form from a page of another origin.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler

from tests.fixtures.manager import make_manager

from .inprocess import PREFIX, PagesService, attrs, chromium_on, field, user_model

NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 1, "model": "NVIDIA RTX A6000"}}]
MODELS = {"admin-token": user_model("admin", admin=True)}
REASON = "from a form"


@pytest.fixture
async def service(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4}, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    manager.accounts.ensure("alice")
    s = PagesService(manager, MODELS)
    yield s
    s.stop()


def granted(service) -> list[Decimal]:
    return [e.amount for e in service.manager.ledger.history("alice") if e.reason == REASON]


async def grant_form(browser) -> dict[str, str]:
    """A freshly rendered grant form (its own idempotency key), filled in."""
    page = (await browser.get("admin/grant")).body.decode()
    return {"user": "alice", "amount": "5", "reason": REASON, "key": field(page, "key"),
            "_xsrf": field(page, "_xsrf")}


async def test_a_cross_origin_post_is_refused_and_changes_nothing_a_same_origin_one_grants(service):
    admin = service.client("admin-token")
    balance = service.manager.ledger.balance("alice")
    form = await grant_form(admin)  # a valid login and _xsrf: only where the form came from differs
    foreign = {
        "another site": {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        "another site, old browser": {"Origin": "https://evil.example"},
        "a sibling host (a user's server)": {"Origin": f"http://127.0.0.1:{service.port + 1}",
                                             "Sec-Fetch-Site": "same-site"},
        "a sandboxed frame": {"Origin": "null"},
        "no Origin, but the browser says cross-site": {"Sec-Fetch-Site": "cross-site"},
        "the right host on the wrong port": {"Origin": "http://127.0.0.1"},
        "a public host no proxy reported": {"Origin": "https://hub.example.org"},
    }
    for what, headers in foreign.items():
        r = await admin.post("admin/grant", form, headers=headers)
        body = r.body.decode()
        assert r.code == 403, (what, r.code, body[-300:])
        assert 'data-gpupool="error" data-status="403"' in body, what
        assert "sent from another site" in body and "nothing was changed" in body, what
        assert 'data-gpupool="grant-result"' not in body, what
    verify = await admin.post("admin/ledger", {"_xsrf": form["_xsrf"]}, headers=foreign["another site"])
    assert verify.code == 403 and 'data-gpupool="verify-result"' not in verify.body.decode()
    assert granted(service) == [] and service.manager.ledger.balance("alice") == balance

    # the page's own form, as a browser sends it: granted, once
    r = await admin.post("admin/grant", form, headers={"Origin": service.origin, "Sec-Fetch-Site": "same-origin"})
    assert r.code == 201, r.body.decode()[-300:]
    [result] = attrs(r.body.decode(), 'data-gpupool="grant-result"')
    assert result["data-created"] == "true"
    # behind a proxy that reports the host the browser used (X-Forwarded-Host, Forwarded)
    for proxy in ({"X-Forwarded-Host": "hub.example.org, 10.0.0.5:8000"},
                  {"Forwarded": 'for=10.0.0.9;host="hub.example.org";proto=https'}):
        r = await admin.post("admin/grant", await grant_form(admin),
                             headers={"Origin": "https://hub.example.org", "Sec-Fetch-Site": "same-origin", **proxy})
        assert r.code == 201, (proxy, r.body.decode()[-300:])
    # a command-line tool sends neither header: the _xsrf check alone, as before
    r = await admin.post("admin/grant", await grant_form(admin))
    assert r.code == 201, r.body.decode()[-300:]
    assert granted(service) == [Decimal(5)] * 4
    assert service.manager.ledger.balance("alice") == balance + 20


class AttackerPage(RequestHandler):
    """A page of another origin with a copy of the grant form (its _xsrf leaked, say)."""

    def get(self) -> None:
        target, fields = self.settings["target"], self.settings["fields"]
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
        self.finish(f'<!doctype html><form method="post" action="{target}">{inputs}'
                    f'<button type="submit">Win a GPU</button></form>')


@pytest.mark.integration
async def test_a_form_on_another_origin_submitted_in_chromium_is_refused_the_pages_own_form_grants(service):
    async with chromium_on(service) as open_as:
        page = await open_as("admin-token")
        await page.goto(f"{service.origin}{PREFIX}admin/grant")
        form = page.locator("[data-gpupool=grant-form]")
        fields = {"user": "alice", "amount": "5", "reason": REASON,
                  "key": await form.locator("input[name=key]").input_value(),
                  "_xsrf": await form.locator("input[name=_xsrf]").input_value()}
        # another origin on the same machine (a user's server on another port): same-site, so the
        # browser even sends the login cookie along
        sock, port = bind_unused_port()
        attacker = HTTPServer(Application([(r"/", AttackerPage)], target=f"{service.origin}{PREFIX}admin/grant",
                                          fields=fields))
        attacker.add_sockets([sock])
        try:
            evil = await page.context.new_page()
            await evil.goto(f"http://127.0.0.1:{port}/")
            async with evil.expect_navigation() as nav:
                await evil.click("button[type=submit]")
            response = await nav.value
            assert response.status == 403
            assert "sent from another site" in await evil.locator("[data-gpupool=error]").inner_text()
            assert granted(service) == []
        finally:
            attacker.stop()
        # the same fields in the page's own form: granted
        for name in ("user", "amount", "reason"):
            await form.locator(f"input[name={name}]").fill(fields[name])
        async with page.expect_navigation() as nav:
            await form.locator("button[type=submit]").click()
        assert (await nav.value).status == 201
        assert "Granted" in await page.locator("[data-gpupool=grant-result]").inner_text()
        assert granted(service) == [Decimal(5)]
