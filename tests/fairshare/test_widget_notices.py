"""Issue 18.5 in the browser: a notice in the lab widget, dismissed with its button.

A real hub and service, a real JupyterLab (CPU profile) in headless Chromium.
alice's GPU server "gpu" (an allocation of the service) is stopped by the real
cull job when her balance reaches the floor; her widget shows the notice (the
status bar's "1 notice", the panel's box with what was kept), and its Dismiss
button removes it from the widget and from ``GET me``; bob never sees it.

The single-user servers load the lab extension as built in this checkout
(``gpupool_hub/labext/labextension``, first on their ``JUPYTER_PATH``), so the
widget under test is this tree's.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests.e2e.conftest import allow_root, lab_environment, q, shut_down, spawn
from tests.fixtures.hub import wait_for
from tests.labext.browser import browser_page, chromium_executable  # noqa: F401 (fixtures)
from tests.labext.browser import hub_login, open_panel, wait_for_status_item

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
BUILT = ROOT / "gpupool_hub" / "labext" / "labextension"
LAB_MS = 90_000
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "default": True},
    {"slug": "gpu", "display_name": "1 GPU", "gpus": 1},
]


def notice_config(workdir: Path) -> str:
    env = lab_environment(workdir, 1)
    if (BUILT / "package.json").exists():  # this checkout's build of the widget, not another's
        share = workdir / "share"
        (share / "labextensions" / "@gpupool").mkdir(parents=True)
        (share / "labextensions" / "@gpupool" / "hub-balance").symlink_to(BUILT)
        env["JUPYTER_PATH"] = str(share)
    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
    return f"""
c.JupyterHub.spawner_class = "gpupool-simple"
c.JupyterHub.allow_named_servers = True
c.GPUPoolSpawner.profiles = {PROFILES!r}
c.Spawner.default_url = "/lab"
c.Spawner.cmd = [{str(singleuser)!r}]
c.Spawner.http_timeout = 90
c.Spawner.start_timeout = 90
c.Spawner.environment = {env!r}
{allow_root()}
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home") + "/{username}"!r}
c.JupyterHub.load_roles.append({{
    "name": "server",
    "scopes": ["users:activity!user", "access:servers!server", "access:services!service=gpupool"],
}})
c.Culler.interval = 0.5
c.GPUPoolService.reconcile_interval = 3600
"""


@pytest.fixture
def notice_hub(chromium_executable, hub_factory):
    hub = hub_factory(start=False)
    hub.extra_config = notice_config(hub.workdir)
    hub.start()
    try:
        yield hub
    finally:
        shut_down(hub)


def test_18_5_widget_shows_a_notice_until_dismissed(notice_hub, browser_page):
    from playwright.sync_api import expect

    hub, page = notice_hub, browser_page
    hub.create_user("admin")
    hub.create_user("bob")
    admin, bob = hub.token_for("admin"), hub.token_for("bob")
    server = spawn(hub, "alice", {"profile": "cpu"}, timeout=LAB_MS / 1000)
    alice = hub.token_for("alice")
    try:
        hub_login(page, hub.url, "alice")  # the hub's OAuth then lets her into her server
        page.goto(f"{hub.url}{server['url']}lab", wait_until="domcontentloaded")
        wait_for_status_item(page, timeout_ms=LAB_MS)
        # alice's GPU server "gpu" holds a GPU; her balance reaches the floor: the cull job stops it
        r = hub.service("POST", "/allocations", hub.spawner_token,
                        json={"user": "alice", "server": "gpu", "request": {"gpus": 1}})
        assert r.status_code == 201, r.text
        me = hub.service("GET", "/me", alice).json()
        r = hub.service("POST", f"/users/{q('alice')}/grant", admin,
                        json={"amount": str(Decimal(me["floor"]) - Decimal(me["balance"])), "reason": "test"})
        assert r.status_code == 201, r.text
        [n] = wait_for(lambda: hub.service("GET", "/me", alice).json()["notices"], timeout=30,
                       what="alice's notice of the floor stop")
        assert n["kind"] == "floor_stop" and n["server"] == "gpu"
        item = wait_for_status_item(page, "1 notice", timeout_ms=15_000)
        panel = open_panel(page)
        box = panel.locator(f"[data-notice='{n['id']}']")
        expect(box).to_contain_text("Your server was stopped: your balance reached the floor")
        expect(box).to_contain_text("files and notebooks on disk are untouched")
        assert hub.service("GET", "/me", bob).json()["notices"] == []
        box.locator("[data-gpupool='dismiss']").click()
        expect(panel.locator("[data-gpupool='notices']")).to_have_count(0, timeout=15_000)
        expect(item).not_to_contain_text("notice")
        assert hub.service("GET", "/me", alice).json()["notices"] == []
    except Exception:
        print("--- browser console ---\n" + "\n".join(getattr(page, "gpupool_console", [])))
        print(f"--- hub log ---\n{hub.log_tail(60)}")
        raise
