"""The spawn page as a researcher meets it (issue 39.4 and 39.5), in headless Chromium.

The hub runs the shipped example configuration as ``scripts/demo.sh`` does (its
pool: 8 × RTX 2080, 4 × RTX 3090, 2 × RTX A6000; its profiles, prices and
credits), with tiny single-user servers. The browser lives in Berlin while the
pool's credit day is UTC, so every date the page shows must be the browser's.
One hub, four states of the same page, each checked as a user notices it and
saved under ``build/screenshots/`` (``scripts/update-screenshots.sh`` copies them to
``docs/images/``):

- normal: one card per profile, each a radio input named by its label, with
  its GPU, CPU and memory, price, the hours the balance buys and what is free;
  the arrow keys move the choice; the credits name their next dates in Berlin time;
- full: both A6000s held and one researcher waiting: the A6000 card says
  "full — 1 waiting…", highlighted;
- refused: at −7.5 tokens the A6000 (4 tokens/h) is refused; the banner and the
  card name the same 4 tokens, the banner the daily credit's day in Berlin
  time, and the refused profile stays selected;
- after a floor stop: the stopped researcher's page preselects CPU only;
  her "My GPU usage" page words its dates in Berlin time too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub import wait_for
from tests.labext.browser import LAB_TIMEOUT_MS, hub_login, launch_chromium
from tests.spawner.conftest import TINY, set_balance

from .conftest import spawn, stop_server, user_model

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

SHOTS = Path(__file__).parents[2] / "build" / "screenshots"
ZONE = r"(CET|CEST)"
EXTRA = """
# as scripts/demo.sh: every server runs as the hub's own user (the example's gpupool-localprocess
# needs a Unix account per user)
c.JupyterHub.spawner_class = "gpupool-simple"
c.SimpleLocalProcessSpawner.home_dir_template = {home!r}
# the floor is enforced every c.Culler.interval (60 s as shipped); the test waits seconds, not a minute
c.Culler.interval = 1
"""


@pytest.fixture
def berlin_page(chromium_executable: str, tmp_path: Path) -> Iterator:
    """A browser in Europe/Berlin (the pool's credit day is UTC): dates must follow the browser."""
    with launch_chromium(tmp_path / "chromium-berlin", chromium_executable, viewport={"width": 1100, "height": 900},
                         timezone_id="Europe/Berlin") as context:
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(LAB_TIMEOUT_MS)
        yield page


def open_spawn_page(page, hub, name: str) -> None:
    page.context.clear_cookies()
    hub_login(page, hub.url, name)
    if "/hub/spawn" not in page.url:
        page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
    page.wait_for_selector("#spawn_form .gpupool-profile")


def shoot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("div:has(> #spawn_form)").screenshot(path=str(SHOTS / name))


def card(page, slug: str):
    return page.locator(f"#spawn_form [data-profile='{slug}']")


def test_the_spawn_page_normal_full_refused_and_after_a_floor_stop(example_hub_factory, berlin_page, tmp_path):
    from playwright.sync_api import expect

    page = berlin_page
    hub = example_hub_factory(server_cmd=[sys.executable, str(TINY)],
                              extra=EXTRA.format(home=str(tmp_path / "home") + "/{username}"))

    # -- normal: cards a researcher can scan, and choose from with the keyboard
    open_spawn_page(page, hub, "rosa")
    assert page.locator("#spawn_form input[type=radio][name=profile]").count() == 5
    a6000 = card(page, "1xa6000")
    expect(page.get_by_role("radio", name="1 × RTX A6000")).not_to_be_checked()
    for words in ("Large models that need 48 GiB on one GPU.", "GPU: 1 × NVIDIA RTX A6000", "8 CPUs · 32 GiB memory",
                  "4 tokens/h", "2 of 2 GPUs free", "Your balance buys 28 h above the floor"):  # (100 + 10) / 4
        expect(a6000).to_contain_text(words)
    half = card(page, "half-a6000")
    expect(half).to_contain_text("½ of one NVIDIA RTX A6000, 24 GiB of its memory")
    expect(half).to_contain_text("time-sliced: shared, best effort")
    credits = page.locator(".gpupool-credits")
    expect(credits).to_contain_text(re.compile(rf"\+1 token every day, next on \w{{3}} \d+ \w{{3}} \d{{4}}, 01:00 {ZONE}"))
    expect(credits).to_contain_text(re.compile(rf"\+30 tokens on the 1st of each month, next on .*, 0[12]:00 {ZONE}"))
    cpu = page.get_by_role("radio", name="CPU only")
    expect(cpu).to_be_checked()
    cpu.focus()
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("radio", name="1 × RTX 2080")).to_be_checked()
    expect(page.get_by_role("radio", name="1 × RTX 2080")).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(cpu).to_be_checked()
    shoot(page, "spawn-page.png")

    # -- full: both A6000s held, one researcher waits; the card says so, highlighted
    for name in ("alice", "bob"):
        spawn(hub, name, {"profile": "1xa6000"})
    hub.create_user("carol")
    r = hub.hub_request("POST", "/users/carol/server", json={"user_options": {"profile": "1xa6000"}})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: [w for w in hub.service("GET", "/queue", hub.tester_token).json()["waiting"]
                      if w["user"] == "carol"], 60, "carol to wait in the queue")

    def full_shown() -> bool:  # the catalog is reused for a few seconds (every spawn form asks)
        page.reload(wait_until="domcontentloaded")
        return "full — 1 waiting" in card(page, "1xa6000").inner_text()

    wait_for(full_shown, 60, "the A6000 card to say it is full")
    expect(a6000).to_have_attribute("data-full", "true")
    expect(a6000.locator(".gpupool-full")).to_have_text(re.compile(r"^full — 1 waiting"))
    assert a6000.locator(".gpupool-full").evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    shoot(page, "spawn-page-full.png")
    for name in ("carol", "alice", "bob"):
        stop_server(hub, name, timeout=60)

    # -- refused: the banner and the card name one amount; the refused profile stays chosen
    set_balance(hub, "rosa", "-7.5")
    page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
    expect(a6000).to_contain_text("needs 4 tokens above your floor for its first 1 h; you have 2.5")
    page.get_by_role("radio", name="1 × RTX A6000").check()
    with page.expect_navigation(wait_until="domcontentloaded"):
        page.locator("#spawn_form button[type=submit]").click()
    banner = page.locator(".spawn-error-msg")
    expect(banner).to_contain_text("Not enough tokens: your balance is \u22127.5 and this server costs 4 tokens/h; "
                                   "starting needs 4 tokens above the floor of \u221210 for its first 1 h.")
    # 2.5 above the floor, +1 a day: the daily credit of the day after tomorrow, at midnight UTC in Berlin time
    expect(banner).to_contain_text(re.compile(rf"With the daily credits you can start it from .*, 01:00 {ZONE}\."))
    expect(page.get_by_role("radio", name="1 × RTX A6000")).to_be_checked()
    expect(card(page, "1xa6000")).to_contain_text("needs 4 tokens above your floor")
    assert "(s)" not in banner.inner_text()
    shoot(page, "spawn-page-refused.png")

    # -- after a floor stop: CPU only is preselected, and the page says why
    spawn(hub, "fay", {"profile": "1x2080"})
    set_balance(hub, "fay", "-10")
    wait_for(lambda: not user_model(hub, "fay").get("servers"), 60, "the floor to stop fay's server")
    open_spawn_page(page, hub, "fay")
    expect(page.get_by_role("radio", name="CPU only")).to_be_checked()
    expect(page.locator(".gpupool-notice")).to_contain_text("Your GPU server was stopped at ")
    expect(page.locator(".gpupool-notice")).to_contain_text("because your balance reached the floor (\u221210 tokens).")
    expect(page.locator(".gpupool-floor-stopped")).to_contain_text("CPU only is chosen below")
    expect(page.locator(".gpupool-balance")).to_contain_text("at the floor (\u221210)")
    expect(card(page, "1x2080")).to_contain_text("it needs 0.5 tokens above your floor for its first 1 h; you have 0")
    expect(card(page, "1x2080")).not_to_contain_text("buys")  # never hours bought below the floor
    expect(page.locator(".gpupool-notice time")).to_have_text(re.compile(rf", \d\d:\d\d {ZONE}$"))
    shoot(page, "spawn-page-floor-stop.png")

    # the service's pages word dates the same way, in the browser's zone
    # the balance line's link (it opens a new tab); the notice's help links there too
    usage = page.locator(".gpupool-balance").get_by_role("link", name="My GPU usage").get_attribute("href")
    page.goto(f"{hub.url}{usage}", wait_until="domcontentloaded")
    page.wait_for_url("**/services/gpupool/")
    expect(page.locator("time[data-gpupool-local='1']").first).to_have_text(re.compile(rf", \d\d:\d\d {ZONE}$"))
