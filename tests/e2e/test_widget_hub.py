"""The balance widget end to end, in headless Chromium, against the real thing.

A real JupyterHub (configurable-http-proxy, DummyAuthenticator) with the
gpupool service and the ``gpupool-simple`` spawner; the user logs in through
``/hub/login``, picks the GPU profile on the spawn page and lands in a real
``jupyterhub-singleuser`` JupyterLab, whose server extension forwards the
widget's polls (every second here) to the service with the server's own token
(the ``server`` role grants ``access:services!service=gpupool``, as in the
example config). An admin's grants move the balance; the widget follows
within one poll, and a negative balance turns it to the negative state. Then
alice's GPU idles (its node agent reports 0 %) while bob waits for it: her
panel shows the GPU's utilization and memory and the idle countdown, her status
item the stop countdown (issue 14). The pool has one RTX 3090, so bob must wait.
The spawn page also offers one share of each guarantee class (timeslice, mps,
MIG), and the test checks that Chromium shows each class in words ("shared,
best effort", "memory capped", "isolated") next to its own profile.
The test saves ``build/screenshots/widget-hub.png`` and ``spawn-classes.png``
(``scripts/update-screenshots.sh`` copies them to ``docs/images/``).
"""

from __future__ import annotations

import threading
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from ..labext.browser import hub_login, open_panel, screenshot_widget, wait_for_status_item
from .conftest import lab_server_config, q, shut_down, user_model

pytestmark = pytest.mark.integration

#: Written where the tests own the files (git-ignored); scripts/update-screenshots.sh copies it to docs/images/.
SCREENSHOT = Path(__file__).parents[2] / "build" / "screenshots" / "widget-hub.png"
MINUS = "\u2212"
POLL_SECONDS = 1
#: One poll (1 s) plus slack for two busy cores.
ONE_POLL_MS = 8_000
#: Spawning jupyterhub-singleuser and loading JupyterLab (~10 MB of JavaScript) on two shared cores.
LAB_MS = 90_000

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G", "default": True},
    {"slug": "1x3090", "display_name": "1 × RTX 3090", "gpus": 1, "models": ["RTX 3090"], "cpu": 2, "memory": "4G"},
    # one share of each guarantee class (issue 23 item 4): the spawn page names each in words
    {"slug": "half", "display_name": "½ RTX 3090", "gpu_fraction": 0.5, "models": ["RTX 3090"]},
    {"slug": "capped", "display_name": "¾ RTX 3090, MPS", "gpu_fraction": 0.75, "share": "mps",
     "models": ["RTX 3090"]},
    {"slug": "slice", "display_name": "A100 MIG slice", "mig": "1g.10gb", "models": ["A100"]},
]
#: each share's class as the spawn page says it, next to its profile
CLASS_WORDS = {"half": "shared, best effort", "capped": "memory capped", "slice": "isolated"}


#: one RTX 3090, so that a second user waits for alice's (idle reclaim, issue 14)
NODES = [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
          "gpus": [{"index": 0, "uuid": "GPU-widget-0", "model": "NVIDIA GeForce RTX 3090"}]}]
AGENT_TOKEN = "agent-secret-widget"
GIB = 1 << 30


def widget_config(workdir: Path) -> str:
    return f"""
c.GPUPool.nodes = {NODES!r}
c.GPUPool.idle_after = 2
c.GPUPool.idle_grace = 600
c.GPUPool.min_runtime = 1
c.GPUPoolService.idle_interval = 0.5
c.GPUPoolService.agent_tokens = {{"node-a": {AGENT_TOKEN!r}}}
""" + lab_server_config(workdir, PROFILES, POLL_SECONDS)


def shown(amount: Decimal) -> str:
    """What the widget shows: one decimal, half away from zero, U+2212 for negatives."""
    text = f"{amount.quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)} tokens"
    return text.replace("-", MINUS)


@pytest.fixture
def widget_hub(chromium_executable, hub_factory):
    # chromium_executable first: skip before starting anything when there is no browser
    hub = hub_factory(start=False)
    hub.extra_config = widget_config(hub.workdir)
    hub.start()
    try:
        yield hub
    finally:
        shut_down(hub)


def test_widget_follows_the_real_service(widget_hub, browser_page):
    from playwright.sync_api import expect

    hub, page = widget_hub, browser_page
    name = "alice"
    hub.create_user(name)
    hub.create_user("admin")
    admin = hub.token_for("admin")  # a gpupool admin through the "gpupool-admins" role
    user = hub.token_for(name)

    def balance() -> Decimal:
        r = hub.service("GET", "/me", user)
        assert r.status_code == 200, r.text
        return Decimal(r.json()["balance"])

    def grant(amount: Decimal) -> Decimal:
        r = hub.service("POST", f"/users/{q(name)}/grant", admin,
                        json={"amount": str(amount), "reason": "e2e widget test"})
        assert r.status_code == 201, r.text
        return balance()

    start = balance()
    timings: dict[str, float] = {}
    try:
        # Log in, pick the GPU profile on the spawn page, start.
        hub_login(page, hub.url, name)
        if "/hub/spawn" not in page.url:
            page.goto(f"{hub.url}/hub/spawn", wait_until="domcontentloaded")
        form = page.locator("#spawn_form")
        expect(form).to_contain_text("1 × RTX 3090")
        expect(form.locator("[data-profile='1x3090'] .gpupool-price")).to_contain_text("1 token/h")
        # Each share's guarantee class, visible in words next to its own profile; whole GPUs have none.
        for slug, words in CLASS_WORDS.items():
            expect(form.locator(f"[data-profile='{slug}'] .gpupool-class")).to_contain_text(words)
            expect(form.locator(f"[data-profile='{slug}'] .gpupool-class")).to_be_visible()
        expect(form.locator("[data-profile='capped'] .gpupool-price")).to_contain_text("0.75 tokens/h")
        expect(form.locator("[data-profile='half'] .gpupool-price")).to_contain_text("0.5 tokens/h")
        expect(form.locator("[data-profile='1x3090'] .gpupool-class")).to_have_count(0)
        form.screenshot(path=str(SCREENSHOT.with_name("spawn-classes.png")))
        page.check("input[name='profile'][value='1x3090']")
        t0 = time.monotonic()
        form.locator("button[type='submit']").click()

        # The progress page hands over to JupyterLab, where the status item shows the balance.
        page.wait_for_url(f"**/user/{name}/lab**", timeout=LAB_MS)
        item = wait_for_status_item(page, shown(start), state="fine", timeout_ms=LAB_MS)
        timings["lab"] = time.monotonic() - t0
        expect(item).to_contain_text(f"{MINUS}1.0/h")  # one RTX 3090 at 1 token/h
        server = user_model(hub, name)["servers"][""]
        assert server["user_options"] == {"profile": "1x3090"}
        [alloc] = hub.service("GET", "/me", user).json()["allocations"]
        assert alloc["gpus"][0]["model"] == "NVIDIA GeForce RTX 3090"

        # An admin grant: the widget follows within one poll.
        after = grant(Decimal("25.5"))
        assert after == start + Decimal("25.5")
        t0 = time.monotonic()
        wait_for_status_item(page, shown(after), state="fine", timeout_ms=ONE_POLL_MS)
        timings["grant"] = time.monotonic() - t0

        # A large negative grant: below zero (above the floor of -10), the negative state.
        negative = grant(-(after + Decimal("4.25")))
        assert negative == Decimal("-4.25")
        t0 = time.monotonic()
        wait_for_status_item(page, f"{MINUS}4.3 tokens", state="negative", timeout_ms=ONE_POLL_MS)
        timings["negative"] = time.monotonic() - t0
        expect(item).to_contain_text(f"{MINUS}1.0/h")
        expect(item).to_contain_text("~6 h")  # 5.75 tokens above the floor at 1 token/h

        # The panel: the GPU held, its price, the balance in words.
        panel = open_panel(page)
        gpus = panel.locator("[data-gpupool='gpus']")
        expect(gpus).to_contain_text("NVIDIA GeForce RTX 3090 #")
        expect(gpus).to_contain_text("1.0 tokens/h")
        expect(panel).to_contain_text(f"{MINUS}4.3 tokens")
        link = panel.locator("[data-gpupool='usage-link']")  # issue 15: the way to the usage page
        expect(link).to_have_attribute("href", "/services/gpupool/")
        page.wait_for_timeout(300)  # let the popup settle before the picture
        screenshot_widget(page, SCREENSHOT)
        page.screenshot(path=str(hub.workdir / "lab.png"))

        # Issue 14: alice's GPU idles while bob waits for it; her widget counts down.
        r = hub.service("PUT", "/nodes/node-a/utilization", AGENT_TOKEN,
                        json={"gpus": {"GPU-widget-0": 0.0}, "memory": {"GPU-widget-0": [GIB, 24 * GIB]}})
        assert r.status_code == 200, r.text
        activity = panel.locator("[data-gpupool='activity']")
        expect(activity).to_contain_text("RTX 3090 #0: 0 %, 1.0 / 24.0 GiB", timeout=ONE_POLL_MS)
        expect(activity.locator("[data-gpupool='idle']")).to_contain_text("may be reclaimed", timeout=ONE_POLL_MS)
        hub.create_user("bob")
        t0 = time.monotonic()
        threading.Thread(target=hub.hub_request, args=("POST", "/users/bob/server"),
                         kwargs={"json": {"user_options": {"profile": "1x3090"}}}, daemon=True).start()
        idle = activity.locator("[data-gpupool='idle']")
        expect(idle).to_contain_text("someone is waiting: stops in 9:", timeout=30_000)
        timings["idle_warning"] = time.monotonic() - t0
        expect(item).to_contain_text("server stops in 9:")
        first = idle.text_content()
        expect(idle).not_to_have_text(first or "", timeout=3_000)  # the countdown ticks every second
        screenshot_widget(page, SCREENSHOT.with_name("widget-idle.png"))
        hub.hub_request("DELETE", "/users/bob/server")  # bob gives up: alice keeps her GPU
        print(f"timings (s): {timings}")
    except Exception:
        console = "\n".join(getattr(page, "gpupool_console", []))
        print(f"--- browser console ---\n{console}\n--- hub log ---\n{hub.log_tail(80)}")
        page.screenshot(path=str(hub.workdir / "failure.png"))
        raise
