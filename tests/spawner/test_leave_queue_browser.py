"""Issue 39.1 in Chromium: the notification when a waiting server is ready, and "Leave the queue".

A real JupyterHub with the project's hub pages (as the example configuration sets them), the
gpupool service and tiny servers; the pool has one RTX 3090, which alice holds.
- bob queues from the spawn page. The progress page offers "Notify me when it is ready"; the
  browser's permission is asked for only when he clicks it (never on load). alice stops, bob's
  server starts, and the page shows the notification "Your server is ready" as it leaves for it.
- carol queues behind dave from the spawn page ("2nd"); dave gives up and her place moves up on
  the same row of the event log ("1st"), no new row. She clicks "Leave the queue": the page says
  "You left the queue", stays where it is (no reload, no redirect), and the queue no longer has her.
- dave queues and leaves from the hub's home page: "You left the queue" there too; and again
  with a named server, from its own line.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.hub import Hub, wait_for
from tests.labext.browser import browser_page, chromium_executable, hub_login  # noqa: F401 (fixtures)

from .conftest import spawn, spawner_hub, stop_server, user_model
from .test_queue_hub import ONE_GPU, positions

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

EXTRA = f"""
c.GPUPool.nodes = {json.dumps(ONE_GPU)}
c.GPUPoolService.queue_interval = 0.5
"""
PLACE = re.compile(r"You are 1st in the queue")

#: counts the page's permission requests and keeps the notifications it shows, across the reload
#: that takes the page to the server (sessionStorage); the browser's own Notification does the work
RECORD_NOTIFICATIONS = """
(() => {
  if (!("Notification" in window)) return;
  const Real = window.Notification;
  const asked = Real.requestPermission.bind(Real);
  Real.requestPermission = (...args) => {
    sessionStorage.setItem("gpupool-asked", String(Number(sessionStorage.getItem("gpupool-asked") || 0) + 1));
    return asked(...args);
  };
  class Recorded extends Real {
    constructor(title, options) {
      super(title, options);
      const seen = JSON.parse(sessionStorage.getItem("gpupool-notes") || "[]");
      seen.push(title);
      sessionStorage.setItem("gpupool-notes", JSON.stringify(seen));
    }
  }
  window.Notification = Recorded;
})();
"""


@pytest.fixture
def queue_hub(chromium_executable, tmp_path_factory):  # noqa: F811 (the browser fixture above)
    yield from spawner_hub(tmp_path_factory, "leavehub", EXTRA)


def queue_from_the_spawn_page(page, hub: Hub, name: str, place: re.Pattern[str] = PLACE) -> None:
    from playwright.sync_api import expect

    page.context.clear_cookies()
    hub_login(page, hub.url, name)
    if "/hub/spawn" not in page.url:
        page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
    page.check("input[name='profile'][value='1gpu']")
    page.locator("#spawn_form [type='submit']").click()
    page.wait_for_url(f"**/hub/spawn-pending/{name}**", timeout=60_000)
    expect(page.locator("#progress-message")).to_contain_text(place, timeout=60_000)
    expect(page.locator("#stop-server-btn")).to_have_text("Leave the queue")


def test_ready_notification_on_request_and_leaving_the_queue(queue_hub, browser_page):
    from playwright.sync_api import expect

    hub, page = queue_hub, browser_page
    page.context.add_init_script(RECORD_NOTIFICATIONS)
    r = spawn(hub, "alice", {"profile": "1gpu"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (user_model(hub, "alice").get("servers", {}).get("") or {}).get("ready"), 60, "alice's server")
    for name in ("bob", "carol", "dave"):
        hub.create_user(name)

    # bob waits; the page offers the notification but asks the browser nothing by itself
    queue_from_the_spawn_page(page, hub, "bob")
    notify = page.locator("#gpupool-notify-btn")
    expect(notify).to_be_visible()
    assert page.evaluate("Notification.permission") == "default"
    assert page.evaluate("sessionStorage.getItem('gpupool-asked')") is None
    page.context.grant_permissions(["notifications"], origin=hub.url)  # what he answers to the prompt
    notify.click()
    expect(page.locator("#stop-server-status")).to_have_text(
        "This page will show a notification when your server is ready.")
    expect(notify).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('gpupool-asked')") == "1"

    # alice stops: bob's server starts, the page notifies and goes to it
    stop_server(hub, "alice")
    page.wait_for_url("**/user/bob/**", timeout=60_000)
    assert json.loads(page.evaluate("sessionStorage.getItem('gpupool-notes')")) == ["Your server is ready"]

    # carol waits behind dave; dave gives up, and her place moves up on the same row of the log
    r = hub.hub_request("POST", "/users/dave/server", json={"user_options": {"profile": "1gpu"}})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: positions(hub).get("dave"), 30, "dave in the queue")
    queue_from_the_spawn_page(page, hub, "carol", re.compile("You are 2nd in the queue"))
    stop_server(hub, "dave")
    expect(page.locator("#progress-message")).to_contain_text(PLACE, timeout=30_000)
    page.locator("#progress-details summary").click()
    rows = [row.strip() for row in page.locator("#progress-log .progress-log-event").all_inner_texts()]
    assert [row for row in rows if "in the queue" in row] == [page.inner_text("#progress-message")], rows
    assert all(rows) and all(a != b for a, b in zip(rows, rows[1:])), rows

    # carol leaves from the progress page: told so, and the page stays put
    pending_url = page.url
    page.evaluate("window.gpupoolSamePage = true")  # gone if the page reloads or navigates
    navs: list[str] = []
    page.on("framenavigated", lambda frame: navs.append(frame.url))
    page.locator("#stop-server-btn").click()
    try:
        expect(page.locator("#gpupool-lead")).to_have_text("You left the queue.")
    except AssertionError:
        raise AssertionError(f"navigated to {navs}; console:\n" + "\n".join(page.gpupool_console[-30:])
                             + "\n" + hub.log_tail(40)) from None
    wait_for(lambda: not (user_model(hub, "carol").get("servers") or {}).get(""), 30, "carol's server gone")
    assert "carol" not in positions(hub)
    expect(page.locator("#progress-message")).to_have_text("")  # the cancelled spawn's "failed" is not shown
    # JupyterHub says "ready" for the second between the cancel and the stop: a page that followed
    # it looped through the hub's redirects ("Redirect loop detected")
    assert navs == [] and page.url == pending_url and page.evaluate("window.gpupoolSamePage") is True
    expect(page.locator("#gpupool-hint a")).to_have_text(["Start a server", "Home"])

    # dave waits and leaves from the hub's home page
    page.context.clear_cookies()
    hub_login(page, hub.url, "dave")
    r = hub.hub_request("POST", "/users/dave/server", json={"user_options": {"profile": "1gpu"}})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: positions(hub).get("dave"), 30, "dave in the queue")
    page.goto(f"{hub.url}/hub/home", wait_until="domcontentloaded")
    row = page.locator(".gpupool-server[data-server-name='']")
    expect(row).to_contain_text(PLACE)
    row.locator(".gpupool-leave").click()
    expect(row).to_contain_text("You left the queue.")
    expect(page.locator("#start")).to_contain_text("Start My Server")
    wait_for(lambda: "dave" not in positions(hub), 30, "dave out of the queue")

    # a named server waits and leaves the same way, from its own line
    r = hub.hub_request("POST", "/users/dave/servers/lab", json={"user_options": {"profile": "1gpu"}})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: positions(hub).get("dave"), 30, "dave's server lab in the queue")
    page.goto(f"{hub.url}/hub/home", wait_until="domcontentloaded")
    named = page.locator(".gpupool-server[data-server-name='lab']")
    expect(named).to_contain_text("Your server “lab” is waiting for a GPU")
    expect(named).to_contain_text(PLACE)
    named.locator(".gpupool-leave").click()
    expect(named).to_contain_text("You left the queue.")
    wait_for(lambda: "dave" not in positions(hub), 30, "dave's server lab out of the queue")
    assert (user_model(hub, "bob")["servers"][""]).get("ready")  # bob kept the GPU throughout
