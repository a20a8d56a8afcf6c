"""The wait range learned from the pool's history, where a researcher sees it, in Chromium
(issue 25: "the spawn page, spawn progress and widget show the range", "the admin
page shows the live accuracy").

A real JupyterHub with the gpupool service and tiny servers; the pool has one
RTX 3090. Before the hub starts, its ledger gets what a pool that has run a
while has: 30 closed sessions of one GPU (20 to 78 minutes) and five waiting
servers that started, four inside the range they were shown. Then alice holds
the GPU, and:
- bob spawns from the spawn page; his progress page says his place and the range
  ("You are 1st in the queue, about 20–45 min.");
- carol opens the spawn page; the full profile says how many wait and the range
  ("full — 1 waiting, about …");
- the admin's pool map says how often starts fell inside the shown range.
Each is checked against the service's own answer and saved as a screenshot
under ``build/screenshots/`` (``scripts/update-screenshots.sh`` copies them to
``docs/images/``). The widget's line is tests/labext/test_browser.py's.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from tests.fixtures.hub import Hub, require_hub_binaries, wait_for
from tests.labext.browser import browser_page, chromium_executable, hub_login  # noqa: F401 (fixtures)

from .conftest import kill_leftovers, spawn, spawner_config, stop_everything, user_model

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

SHOTS = Path(__file__).parents[2] / "build" / "screenshots"
GPU = {"index": 0, "uuid": "GPU-range-0", "model": "NVIDIA GeForce RTX 3090"}
ONE_GPU = [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144, "gpus": [GPU]}]
EXTRA = f"""
c.GPUPool.nodes = {json.dumps(ONE_GPU)}
c.GPUPoolService.queue_interval = 0.5
# as the example configuration: the pages' OAuth asks no confirmation and may carry the admin scope
c.JupyterHub.services[0].update(oauth_no_confirm=True, oauth_client_allowed_scopes=["custom:gpupool:admin"])
"""
#: "about 20–45 min" or "about 1.2–2.0 hours": the range as eta.range_text writes it
RANGE = r"about \d+(\.\d)?–\d+(\.\d)? (min|hours)"
#: the seeded waiters' ranges (seconds from joining) and real waits: four of five inside
STARTED = [(600, 900, 1200, 1000), (600, 900, 1200, 700), (300, 600, 900, 850), (60, 120, 180, 150),
           (60, 120, 180, 600)]


def seed_history(db_url: str, now: datetime) -> None:
    """What a pool that has run a while keeps: closed one-GPU sessions and started waiters."""
    from gpupool_hub.ledger import AllocationRecord, Ledger

    ledger = Ledger(db_url)
    try:
        for i in range(30):
            minutes = 20 + 2 * i
            start = now - timedelta(days=2, hours=i)
            ledger.allocations.add(AllocationRecord(
                id=f"past-{i}", user=f"past{i % 6}", server="", node="node-a",
                gpus=({**GPU, "milli": 1000, "mig_uuid": None},),
                request={"cpu_milli": 0, "memory_mib": 0, "gpus": 1, "gpu_milli": 0, "models": []},
                price_per_hour=Decimal(1), borrowed=False, created_at=start))
            ledger.allocations.release(f"past-{i}", at=start + timedelta(minutes=minutes), reason="stopped")
        for i, (low, mid, high, waited) in enumerate(STARTED):
            joined = now - timedelta(days=1, hours=i)
            ledger.queue.estimate_shown(f"w{i}", f"past{i}", joined, [low, mid, high], "history")
            ledger.queue.estimate_started(f"w{i}", joined + timedelta(seconds=waited))
    finally:
        ledger.close()


@pytest.fixture
def range_hub(chromium_executable, tmp_path):  # noqa: F811 (the browser fixture above)
    require_hub_binaries()
    hub = Hub(tmp_path, spawner_config(tmp_path) + EXTRA)
    seed_history(f"sqlite:///{tmp_path}/gpupool.sqlite", datetime.now(timezone.utc))
    hub.start()
    try:
        yield hub
    finally:
        try:
            stop_everything(hub)
        finally:
            kill_leftovers(hub)
            hub.stop()


def queue(hub) -> dict:
    r = hub.service("GET", "/queue", hub.tester_token)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_range_from_history_on_the_progress_page_the_spawn_page_and_the_pool_map(range_hub, browser_page):
    from playwright.sync_api import expect

    hub, page = range_hub, browser_page
    SHOTS.mkdir(parents=True, exist_ok=True)
    r = spawn(hub, "alice", {"profile": "1gpu"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (user_model(hub, "alice").get("servers", {}).get("") or {}).get("ready"), 60,
             "alice's server")
    for name in ("bob", "carol"):
        hub.create_user(name)

    # bob asks for the GPU from the spawn page and lands on the progress page, queued
    hub_login(page, hub.url, "bob")
    if "/hub/spawn" not in page.url:
        page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
    form = page.locator("#spawn_form")
    expect(form.locator("[data-profile='1gpu']")).to_contain_text("full")
    page.check("input[name='profile'][value='1gpu']")
    form.locator("button[type='submit']").click()
    page.wait_for_url("**/hub/spawn-pending/bob**", timeout=60_000)
    message = page.locator("#progress-message")
    expect(message).to_have_text(re.compile(rf"You are 1st in the queue, {RANGE}\."), timeout=60_000)
    [waiter] = queue(hub)["waiting"]
    assert waiter["user"] == "bob" and waiter["eta_basis"] == "history", waiter
    assert waiter["eta_text"] in message.inner_text(), (waiter, message.inner_text())
    page.screenshot(path=str(SHOTS / "wait-progress.png"))

    # carol sees the profile full, who waits, and for how long, before she asks
    def waited_for() -> list[dict]:  # the catalog is reused for a few seconds (every spawn form asks)
        return [m for m in hub.service("GET", "/models", hub.spawner_token).json()["models"] if m["waiting"]]

    [model] = wait_for(waited_for, 30, "the catalog to count bob")
    page.context.clear_cookies()
    hub_login(page, hub.url, "carol")
    if "/hub/spawn" not in page.url:
        page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
    profile = page.locator("#spawn_form [data-profile='1gpu']")
    expect(profile).to_contain_text(re.compile(rf"full — 1 waiting, {RANGE}"))
    assert model["eta_basis"] == "history" and model["eta_text"] in profile.inner_text(), model
    profile.screenshot(path=str(SHOTS / "wait-spawn-page.png"))

    # the admin's pool map publishes how often the shown range held (seeded: four of five)
    page.context.clear_cookies()
    hub_login(page, hub.url, "admin")
    page.goto(f"{hub.url}/services/gpupool/admin/pool", wait_until="domcontentloaded")
    accuracy = page.locator("[data-gpupool='eta-accuracy']")
    expect(accuracy).to_contain_text("80 % of starts inside the range")
    assert queue(hub)["accuracy"]["in_range"] == pytest.approx(0.8), queue(hub)["accuracy"]
    accuracy.screenshot(path=str(SHOTS / "wait-accuracy.png"))

    # nobody was started by looking: bob still waits first, alice still holds the GPU
    assert [w["user"] for w in queue(hub)["waiting"]] == ["bob"]
    assert (user_model(hub, "alice")["servers"][""]).get("ready")
