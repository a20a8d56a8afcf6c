"""The balance widget in a real JupyterLab, in headless Debian Chromium.

A real ``jupyter lab`` (subprocess, token auth, free loopback port) has the
installed gpupool_hub extensions (nothing enabled by hand) and
``GPUPOOL_API_URL`` pointing at the stand-in service, whose answers the test
changes while the page polls every second (set through the user settings of
``@gpupool/hub-balance:plugin``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from .browser import open_lab, open_panel, screenshot_widget, status_item, wait_for_status_item
from .servers import PLUGIN_ID, JupyterProcess
from .standin import SERVER_TOKEN, StandInService, cull_in, example_me, iso

pytestmark = pytest.mark.integration

#: Written where the tests own the files (git-ignored); scripts/update-screenshots.sh copies it to docs/images/.
SCREENSHOT = Path(__file__).parents[2] / "build" / "screenshots" / "widget.png"
MINUS = "\u2212"
#: One poll (1 s) plus slack for two busy cores.
ONE_POLL_MS = 8_000


@pytest.fixture
def standin():
    with StandInService() as service:
        yield service


@pytest.fixture
def lab(tmp_path, standin):
    env = {"GPUPOOL_API_URL": standin.api_url, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN}
    proc = JupyterProcess(tmp_path / "lab", app="lab", env=env, settings={
        PLUGIN_ID: {"pollInterval": 1},
        # No "get notified about Jupyter news?" toast over the page.
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
    })
    with proc:
        yield proc


def test_status_bar_widget(lab, standin, browser_page):
    from playwright.sync_api import expect

    page = browser_page
    try:
        open_lab(page, lab.url, lab.token)
        item = wait_for_status_item(page, "46.0 tokens", state="fine")
        expect(item).to_contain_text(f"{MINUS}2.0/h")
        expect(item).to_contain_text("~28 h")

        # The widget follows the service within one poll.
        standin.set_me(balance="12.500", status="low", time_to_floor_seconds=2700)
        wait_for_status_item(page, "12.5 tokens", state="low", timeout_ms=ONE_POLL_MS)
        expect(item).to_contain_text("~45 min")

        # Negative: the negative state, and a clear cull warning with a countdown.
        now = datetime.now(timezone.utc)
        base = {**example_me()["allocations"][0], "started_at": iso(now - timedelta(hours=2, minutes=10))}
        borrowed = {
            **base,
            "id": "c3d4",
            "server": "big",
            "node": "node-b",
            "gpus": [{"index": 0, "uuid": "GPU-9a1e", "model": "NVIDIA A100-SXM4-80GB", "fraction": "0.500"}],
            "price_per_hour": "1.500",
            "borrowed": True,
            "description": "node-b, half of an A100 lent by group vision",
            "started_at": iso(now - timedelta(minutes=25)),
        }
        standin.set_me(
            balance="-3.250",
            status="negative",
            allocations=[base, borrowed],
            burn_rate_per_hour="3.500",
            time_to_floor_seconds=6943,
            last_debit_at=iso(now - timedelta(minutes=4)),
            accounting={"status": "delayed",
                        "message": "Prometheus unreachable since 10:00; usage will be charged when it answers"},
            cull_warning=cull_in(10),
            # issue 14: the GPUs at work, idleness, a place in the queue
            gpu_servers=[{"allocation": base["id"], "server": "", "node": "node-a",
                          "gpus": [{"uuid": "GPU-2", "index": 2, "model": "NVIDIA GeForce RTX 3090",
                                    "utilization": 0.02, "memory_used_bytes": 1 << 30,
                                    "memory_total_bytes": 24 << 30}],
                          "measured_at": iso(now), "idle_since": iso(now - timedelta(minutes=45, seconds=5)),
                          "reclaimable_at": iso(now + timedelta(minutes=15)), "max_idle_at": None,
                          "reclaim_deadline": None}],
            waiting=[{"server": "big2", "request": "4 GPUs (a100)", "since": iso(now), "position": 2,
                      "queue_length": 3, "eta": iso(now + timedelta(minutes=30)),
                      # issue 25: the range learned from the pool's history
                      "eta_low": iso(now + timedelta(minutes=20)), "eta_high": iso(now + timedelta(minutes=45)),
                      "eta_text": "about 20–45 min", "eta_basis": "history"}],
            # issue 16.2: her half of the A100 holds more memory than the half allows
            memory_warnings=[{"server": "big", "gpu_uuid": "GPU-9a1e", "gpu_index": 0, "fraction_milli": 500,
                              "limit_bytes": 44 << 30, "used_bytes": 50 << 30, "since": iso(now),
                              "deadline": iso(now + timedelta(minutes=2))}],
        )
        wait_for_status_item(page, f"{MINUS}3.3 tokens", state="negative", timeout_ms=ONE_POLL_MS)
        expect(item).to_contain_text(f"{MINUS}3.5/h")
        expect(item).to_contain_text("borrowed")
        expect(item).to_contain_text("GPU memory 50.0/44.0 GiB")
        cull = item.locator(".gp-Balance-cull")
        expect(cull).to_contain_text("server stops in 9:")
        first = cull.text_content()
        expect(cull).not_to_have_text(first, timeout=3_000)  # it counts down on its own
        page.screenshot(path=str(lab.tmp_path / "statusbar.png"))

        # Click: the panel with the GPUs held, their price, debits, credits, warnings.
        panel = open_panel(page)
        gpus = panel.locator("[data-gpupool='gpus']")
        expect(gpus).to_contain_text("NVIDIA GeForce RTX 3090 #2")
        expect(gpus).to_contain_text("2.0 tokens/h")
        expect(gpus).to_contain_text("NVIDIA A100-SXM4-80GB #0 (0.50 GPU)")
        expect(gpus).to_contain_text("1.5 tokens/h")
        expect(gpus.locator(".gp-BalancePanel-borrowed")).to_have_count(1)
        expect(panel.locator("[data-gpupool='delayed']")).to_contain_text("Accounting delayed")
        expect(panel.locator("[data-gpupool='cull']")).to_contain_text("Server stops in")
        memory = panel.locator("[data-gpupool='memory']")
        expect(memory).to_contain_text("GPU memory over your share: 50.0 GiB of 44.0 GiB allowed")
        expect(memory).to_contain_text("Your 0.5 share of GPU 0 (server big) may hold 44.0 GiB of GPU memory. In 1:")
        expect(panel).to_contain_text("Last debit")
        expect(panel).to_contain_text("Next daily credit")
        expect(panel).to_contain_text("+30.0 tokens")
        activity = panel.locator("[data-gpupool='activity']")
        expect(activity).to_contain_text("RTX 3090 #2: 2 %, 1.0 / 24.0 GiB")
        expect(activity.locator("[data-gpupool='idle']")).to_contain_text(
            "idle 45 min — may be reclaimed in 1")  # 15 min, or 14 on a slow machine
        expect(activity.locator("[data-gpupool='waiting']")).to_have_text(
            "Server big2: waiting for 4 GPUs (a100): 2nd of 3 in the queue, about 20–45 min")
        page.wait_for_timeout(300)  # let the popup settle before the picture
        screenshot_widget(page, SCREENSHOT)

        # Second click closes the panel.
        status_item(page).click()
        expect(page.locator("[data-gpupool='panel']")).to_have_count(0)

        # Service down: a quiet "balance unavailable", not a broken status bar.
        standin.mode = "error"
        wait_for_status_item(page, "balance unavailable", state="unavailable", timeout_ms=ONE_POLL_MS)
        expect(item).to_have_attribute("title", "balance unavailable: gpupool service answered HTTP 500")
        expect(page.locator("#jp-main-statusbar")).to_be_visible()

        # ... and back (after the poll's back-off).
        standin.mode = "ok"
        standin.me = example_me()
        wait_for_status_item(page, "46.0 tokens", state="fine", timeout_ms=30_000)
    except Exception:
        console = "\n".join(getattr(page, "gpupool_console", []))
        print(f"--- browser console ---\n{console}\n--- jupyter lab log ---\n{lab.log()}")
        page.screenshot(path=str(lab.tmp_path / "failure.png"))
        raise


def test_near_the_floor_the_widget_names_the_floor_stop_first(lab, standin, browser_page):
    """Issue 39.6: at −9.6 with a cull warning whose kernels stop in ~9:42, the floor comes first
    (6 minutes): the red place says the GPU servers stop at the floor, the panel says when and that
    it comes before the cull; a floor-stop notice reads as a sentence with the local time."""
    from playwright.sync_api import expect

    page = browser_page
    now = datetime.now(timezone.utc)
    standin.set_me(
        balance="-9.600", status="negative", burn_rate_per_hour="2.400", time_to_floor_seconds=360,
        floor_at=iso(now + timedelta(minutes=6)),
        cull_warning=cull_in(9.7, action="kernels", reason="balance -9.600 is below zero and the pool is under pressure"),
        notices=[{"id": 7, "kind": "floor_stop", "at": iso(now - timedelta(hours=3)), "server": "gpu1",
                  "title": f"Your GPU server was stopped because your balance reached the floor ({MINUS}10 tokens)",
                  "what": "Your GPU server was stopped",
                  "because": f"because your balance reached the floor ({MINUS}10 tokens)",
                  "why": "Servers holding GPUs stop when your balance reaches the floor, so it goes no further "
                         "below zero",
                  "kept": "Your files and notebooks on disk are untouched."}],
    )
    try:
        open_lab(page, lab.url, lab.token)
        item = wait_for_status_item(page, f"{MINUS}9.6 tokens", state="negative")
        expect(item).to_have_attribute("data-floor", "first")
        expect(item.locator(".gp-Balance-cull")).to_have_text(f"\u26a0 GPU servers stop at the floor ({MINUS}10) in ~6 min")
        panel = open_panel(page)
        floor = panel.locator("[data-gpupool='floor']")
        expect(floor).to_contain_text(f"GPU servers stop at the floor ({MINUS}10) in ~6 min")
        expect(floor).to_contain_text("your balance reaches the floor and servers holding GPUs are stopped")
        expect(floor).to_contain_text("This comes before the cull warning (kernels stop in 9:")
        notice = panel.locator("[data-notice='7']")
        expect(notice).to_contain_text("Your GPU server was stopped at ")
        expect(notice).to_contain_text(f"because your balance reached the floor ({MINUS}10 tokens)")
        page.wait_for_timeout(300)
        screenshot_widget(page, SCREENSHOT.with_name("widget-floor.png"))
    except Exception:
        print(f"--- jupyter lab log ---\n{lab.log()}")
        page.screenshot(path=str(lab.tmp_path / "failure.png"))
        raise
