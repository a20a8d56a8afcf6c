"""Issue 39, "Done when" 1: a researcher closes the tab while waiting for a GPU, on the shipped demo.

``scripts/demo.sh`` runs as a user would start it (``jupyterhub_config.example.py``: no
start_timeout, the queue on, JupyterHub's defaults, the project's hub page templates; real
JupyterLab servers). Two researchers hold both RTX A6000s; a third clicks Start for an A6000
in Chromium, reads her place on the progress page and closes it after 10 s. Over the next 90 s
the hub's home page keeps saying the server waits, with its place (and JupyterHub still has the
spawn pending: JupyterHub's 60 s default start_timeout does not end it). One holder stops; within
30 s her home page says the server runs. The progress page's event log never repeats a line: the
place is one row, rewritten in place.

Screenshots (``build/screenshots/queue/``; ``scripts/update-screenshots.sh`` copies them to
``docs/images/``): the waiting progress page, the home page while waiting, and the admin's pool
map with the waiter.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests

from tests.fixtures.hub import wait_for
from tests.labext.browser import browser_page, chromium_executable, hub_login  # noqa: F401 (fixtures)

from .test_demo import demo, log_tail  # noqa: F401 (the demo fixture: scripts/demo.sh in its own group)

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

SHOTS = Path(__file__).parents[2] / "build" / "screenshots" / "queue"
PROFILE = "1xa6000"  # the example's "1 × RTX A6000"; the demo pool has two
PLACE = re.compile(r"You are 1st in the queue")
CLOSE_AFTER = 10.0  # s on the progress page before the tab is closed
STILL_WAITING_FOR = 90.0  # s after the close during which the home page must say it waits
RUNNING_WITHIN = 30.0  # s from a holder's stop to her server running
LOOK_EVERY = 15.0  # s between looks at the home page while she waits


def holds_for(seconds: float, check, what: str, interval: float = 2.0) -> None:
    """Poll ``check`` for ``seconds``; fail at the first falsy answer (a condition that must hold
    over a period, where ``wait_for`` waits for one to become true)."""
    end = time.monotonic() + seconds
    while True:
        assert check(), f"{what} stopped holding"
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(interval, left))


def login(url: str, name: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{url}/hub/login", timeout=30)
    r = session.post(f"{url}/hub/login", timeout=30, data={
        "username": name, "password": "any", "_xsrf": session.cookies.get("_xsrf")})
    assert r.status_code == 200, r.text[:300]
    return session


def start_a6000(url: str, session: requests.Session) -> None:
    r = session.post(f"{url}/hub/spawn", data={"profile": PROFILE, "_xsrf": session.cookies.get("_xsrf")},
                     timeout=60)
    assert r.status_code == 200, r.text[:300]


def lab_answers(url: str, name: str) -> bool:
    try:  # the server itself answers (not the hub's redirect to its login page)
        r = requests.get(f"{url}/user/{name}/api", timeout=5, allow_redirects=False)
        return r.status_code == 200 and "version" in r.json()
    except (requests.RequestException, ValueError):
        return False


def hub_servers(url: str, token: str, name: str) -> dict:
    """The user's servers as JupyterHub sees them (the demo's own service token: read:servers)."""
    r = requests.get(f"{url}/hub/api/users/{name}", headers={"Authorization": f"token {token}"}, timeout=30)
    r.raise_for_status()
    return r.json().get("servers") or {}


def demo_token(state: Path) -> str:
    """The token of the demo script's own hub client (it stops the servers on Ctrl-C)."""
    config = (state / "jupyterhub_config.py").read_text()
    [token] = re.findall(r'"name": "demo-shutdown", "api_token": "([0-9a-f]+)"', config)
    return token


def test_a_closed_tab_keeps_its_place_and_the_home_page_follows_it_to_running(demo, browser_page):
    from playwright.sync_api import expect

    url, page = demo.url, browser_page
    SHOTS.mkdir(parents=True, exist_ok=True)
    wait_for(lambda: demo.poll() is None and service_up(url), 120, "the demo's hub and service")
    token = demo_token(demo.state)

    # alice and bob hold both A6000s
    holders = {name: login(url, name) for name in ("alice", "bob")}
    for name, session in holders.items():
        start_a6000(url, session)
    for name in holders:
        wait_for(lambda: lab_answers(url, name), 180, f"{name}'s JupyterLab on an A6000")

    # carol clicks Start for an A6000 and lands on the progress page, queued
    hub_login(page, url, "carol")
    if "/hub/spawn" not in page.url:
        page.goto(f"{url}/hub/spawn", wait_until="domcontentloaded")
    page.check(f"input[name='profile'][value='{PROFILE}']")
    clicked = time.monotonic()
    page.locator("#spawn_form [type='submit']").click()
    page.wait_for_url("**/hub/spawn-pending/carol**", timeout=60_000)
    expect(page.locator("#progress-message")).to_contain_text(PLACE, timeout=60_000)
    expect(page.locator("#stop-server-btn")).to_have_text("Leave the queue")
    expect(page.locator("#gpupool-hint")).to_contain_text("You may close this page")
    page.locator("#progress-details summary").click()
    page.screenshot(path=str(SHOTS / "progress-waiting.png"), full_page=True)
    # she reads it until 10 s after her click: the page stays, saying her place
    holds_for(clicked + CLOSE_AFTER - time.monotonic(),
              lambda: "/hub/spawn-pending/carol" in page.url and PLACE.search(page.inner_text("#progress-message")),
              "the progress page saying her place", interval=1)
    page.close()  # the tab is closed: nothing of carol's reads the progress stream now
    closed = time.monotonic()

    # for 90 s after the close, her home page says the server waits, and where; JupyterHub keeps
    # the spawn pending all along (its default 60 s start_timeout does not end it)
    home = browser_page.context.new_page()
    row = home.locator(".gpupool-server[data-server-name='']")
    looks: list[float] = []

    def still_waiting() -> bool:
        # "queue" once the hub has answered her click (slow_spawn_timeout, 10 s, + 1 s), "spawn" before
        pending = hub_servers(url, token, "carol").get("", {}).get("pending")
        if pending != "queue" and not (pending == "spawn" and time.monotonic() < clicked + 15):
            return False
        if not looks or time.monotonic() - looks[-1] >= LOOK_EVERY:
            home.goto(f"{url}/hub/home", wait_until="domcontentloaded")
            expect(row).to_have_attribute("data-state", "waiting")
            expect(row).to_contain_text(PLACE)
            expect(row.locator(".gpupool-leave")).to_be_visible()
            if not looks:
                home.screenshot(path=str(SHOTS / "home-waiting.png"))
            looks.append(time.monotonic())
        return True

    holds_for(closed + STILL_WAITING_FOR - time.monotonic(), still_waiting, "carol's server waiting with its place")
    assert looks[-1] - closed >= STILL_WAITING_FOR - LOOK_EVERY and len(looks) >= 5, looks
    home.goto(f"{url}/hub/home", wait_until="domcontentloaded")
    expect(row).to_contain_text(PLACE)  # 90 s after the close

    # the progress log (the page opened again) never repeats a line: the place is one row
    again = browser_page.context.new_page()
    again.goto(f"{url}/hub/spawn-pending/carol", wait_until="domcontentloaded")
    expect(again.locator("#progress-message")).to_contain_text(PLACE, timeout=30_000)
    again.locator("#progress-details summary").click()
    rows = [r.strip() for r in again.locator("#progress-log .progress-log-event").all_inner_texts()]
    assert len(rows) >= 3 and all(rows), rows  # requested, asking, waiting
    assert all(a != b for a, b in zip(rows, rows[1:])), rows
    assert sum(bool(PLACE.search(r)) for r in rows) == 1, rows
    again.close()

    # the admin's pool map lists her, waiting (the same browser, logged in as the admin)
    context = browser_page.context
    context.clear_cookies()
    pool = context.new_page()
    hub_login(pool, url, "admin")
    pool.goto(f"{url}/services/gpupool/admin/pool", wait_until="domcontentloaded")
    expect(pool.locator("table[data-gpupool='waiting'] tr[data-user='carol']")).to_contain_text(re.compile("a6000", re.I))
    pool.screenshot(path=str(SHOTS / "pool-map-waiting.png"), full_page=True)
    pool.close()
    context.clear_cookies()
    hub_login(home, url, "carol")

    # bob stops; carol's server runs within 30 s, and her home page (open, not reloaded) says so
    home.goto(f"{url}/hub/home", wait_until="domcontentloaded")
    expect(row).to_have_attribute("data-state", "waiting")
    bob = holders["bob"]
    r = bob.delete(f"{url}/hub/api/users/bob/server", headers={"X-XSRFToken": bob.cookies.get("_xsrf")},
                   timeout=30)
    assert r.status_code in (202, 204), r.text
    stopped = time.monotonic()
    expect(row).to_have_attribute("data-state", "running", timeout=RUNNING_WITHIN * 1000)
    expect(row).to_contain_text("is running")
    wait_for(lambda: hub_servers(url, token, "carol").get("", {}).get("ready"),
             max(RUNNING_WITHIN - (time.monotonic() - stopped), 1), "carol's server to be ready")
    assert time.monotonic() - stopped <= RUNNING_WITHIN
    home.reload(wait_until="domcontentloaded")
    expect(row).to_contain_text("is running")


def service_up(url: str) -> bool:
    try:
        return requests.get(f"{url}/services/gpupool/api/v1/", timeout=2).status_code == 200
    except requests.RequestException:
        return False
