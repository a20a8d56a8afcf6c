"""Issue 39.6 on "My GPU usage": a floor stop's notice, dismissed from the hub's own page.

A user stopped at the floor cannot reach JupyterLab, where the widget's Dismiss button is;
the page lists the user's own notices in a researcher's words, with the time as a
``<time datetime>`` element, and a Dismiss form (POST, ``_xsrf``, same-origin only). The
real pages app over a real SQLite ledger, the real cull job making the stop (a recording
stand-in for the hub's stop call), real HTTP requests with JupyterHub's own OAuth code.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from gpupool_hub.ledger import AuditEvent
from gpupool_hub.reasons import AuditAction
from gpupool_hub.service.core.admission import parse_request
from tests.fixtures.cull import RecordingHub, cull_job
from tests.fixtures.manager import Clock, make_manager

from .conftest import SCREENSHOTS
from .inprocess import PREFIX, PagesService, attrs, chromium_on, field
from .test_pages_app import MODELS, NODES

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc)


@pytest.fixture
async def service(tmp_path):
    m = make_manager(NODES, {"RTX A6000": 4, "RTX 3090": 1}, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                     clock=Clock(T0), epoch=T0)
    s = PagesService(m, MODELS)
    yield s
    s.stop()


async def stopped_at_the_floor(m) -> None:
    """alice holds an A6000 (4/h) from 9:00 with −9 posted; the cull job stops it at 9:15."""
    m.admission.admit("alice", [], "", parse_request({"gpus": 1, "models": ["RTX A6000"]}), ["RTX A6000"])
    m.accounts.grant("alice", Decimal(-109), "test: near the floor", "test", None)
    m.accounts.ensure("bob")
    m.clock.advance(15 * 60)
    hub = RecordingHub()
    await cull_job(m, hub)()
    assert hub.stopped == [("alice", "")]


def notices_of(body: str) -> list[dict[str, str]]:
    return attrs(body, "data-notice=")


async def test_a_floor_stop_is_told_in_words_and_dismissed_on_the_page(service):
    m = service.manager
    await stopped_at_the_floor(m)
    alice, bob = service.client("alice-token"), service.client("bob-token")
    page = (await alice.get("")).body.decode()
    [notice] = notices_of(page)
    assert notice["data-kind"] == "floor_stop"
    headline = re.search(r'data-gpupool="notice-headline">(.*?)</strong>', page).group(1)
    at = m.views.me("alice")["notices"][0]["at"]  # when the cull job stopped it (the job reads the real time)
    m_ = re.fullmatch(r'Your GPU server was stopped at <time datetime="([^"]+)" data-gpupool-time="year">'
                      r'\w{3} \d{1,2} \w{3} \d{4}, (\d\d:\d\d) UTC</time> because your balance reached the floor '
                      r'\(\u221210 tokens\)\.', headline)
    assert m_ and m_.group(1) == at and m_.group(2) == at[11:16], headline
    assert "at or below" not in page and "balance -10" not in page  # the audit's words stay in the audit
    assert "start again once credits or a grant" in page
    # bob, whose idle server was reclaimed, sees his notice alone, and cannot dismiss hers with his own form
    m.notices.record(AuditEvent(m.clock(), "bob", "big", AuditAction.IDLE_RECLAIM.value, "idle 2 h while others waited"))
    bob_page = (await bob.get("")).body.decode()
    assert [n["data-kind"] for n in notices_of(bob_page)] == ["idle_reclaim"]
    assert "reached the floor" not in bob_page
    refused = await bob.post("me/notices", {"notice": notice["data-notice"], "_xsrf": field(bob_page, "_xsrf")})
    assert refused.code == 404 and "nothing was changed" in refused.body.decode()
    # nor may a form from another site, nor one without _xsrf
    xsrf = field(page, "_xsrf")
    foreign = await alice.post("me/notices", {"notice": notice["data-notice"], "_xsrf": xsrf},
                               headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert foreign.code == 403
    assert (await alice.post("me/notices", {"notice": notice["data-notice"]})).code == 403
    bad = await alice.post("me/notices", {"notice": "1; drop", "_xsrf": xsrf})
    assert bad.code == 400
    assert len(m.views.me("alice")["notices"]) == 1 and len(m.views.me("bob")["notices"]) == 1  # after all that
    # an admin reading alice's page sees it, with no Dismiss button: it is hers to dismiss
    admin_view = (await service.client("admin-token").get("admin/users/alice")).body.decode()
    assert len(notices_of(admin_view)) == 1 and 'data-gpupool="dismiss"' not in admin_view
    assert "What the pool did to alice&#39;s servers" in admin_view
    # alice's own Dismiss: back to her page, which no longer lists it; the widget's GET me agrees
    form = attrs(page, 'data-gpupool="dismiss"')[0]
    assert form["method"] == "post" and form["action"] == "/services/gpupool/me/notices"
    done = await alice.post("me/notices", {"notice": notice["data-notice"], "_xsrf": xsrf},
                            headers={"Origin": service.origin, "Sec-Fetch-Site": "same-origin"})
    assert done.code == 303 and done.headers["Location"] == "/services/gpupool/#notices"
    assert notices_of((await alice.get("")).body.decode()) == []
    assert m.views.me("alice")["notices"] == []


async def test_the_page_names_no_notices_section_without_notices(service):
    body = (await service.client("alice-token").get("")).body.decode()
    assert 'data-gpupool="notices"' not in body


async def test_the_dismiss_address_only_takes_forms(service):
    r = await service.client("alice-token").get("me/notices")
    assert r.code == 405


async def test_alice_dismisses_her_floor_stop_notice_in_chromium(service):
    """The page as a browser shows it (screenshot), and its Dismiss button as a browser submits it:
    a real same-origin form with the login cookie and _xsrf, back to the page without the notice."""
    m = service.manager
    await stopped_at_the_floor(m)
    async with chromium_on(service) as open_as:
        page = await open_as("alice-token")
        await page.goto(f"{service.origin}{PREFIX}")
        notice = page.locator("[data-kind=floor_stop]")
        headline = await notice.locator("[data-gpupool=notice-headline]").inner_text()
        assert headline.startswith("Your GPU server was stopped at ") and headline.endswith(
            "because your balance reached the floor (\u221210 tokens).")
        assert await notice.locator("time").get_attribute("datetime") == m.views.me("alice")["notices"][0]["at"]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOTS / "my-usage-notice.png"), full_page=False)
        await notice.get_by_role("button", name="Dismiss this notice").click()
        await page.wait_for_url(f"{service.origin}{PREFIX}#notices")
        assert await page.locator("[data-gpupool=notices]").count() == 0
    assert m.views.me("alice")["notices"] == []
