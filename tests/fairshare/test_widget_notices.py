"""Issues 18.5-18.7 in the browser: a kernel cull as alice lives it.

A real hub and service, a real JupyterLab on one GPU in headless Chromium.
alice's balance drops below zero while the pool is under pressure: the real
cull job warns her, shuts down her kernels and takes the GPU back. Her widget
then says "⚠ kernels stopped" (not a countdown stuck at 0:00) and shows the
notice (the status bar's "1 notice", the panel's box with what was kept); its
Dismiss button removes it from the widget and from ``GET me``; bob never sees
it. Once she is topped up (no cull any more), a kernel she starts in that
server gets no GPU: the server extension's kernel-start check.

The single-user servers load the installed lab extension, or the build that
``GPUPOOL_LABEXTENSION_DIR`` names (``tests/e2e/conftest.py``'s ``lab_environment``).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tests.e2e.conftest import lab_server_config, q, shut_down, spawn
from tests.spawner.conftest import proc_environ
from tests.fixtures.hub import wait_for
from tests.labext.browser import browser_page, chromium_executable  # noqa: F401 (fixtures)
from tests.labext.browser import hub_login, open_panel, wait_for_status_item

pytestmark = pytest.mark.integration

LAB_MS = 90_000
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "default": True},
    {"slug": "gpu", "display_name": "1 GPU", "gpus": 1},
]


def notice_config(workdir: Path) -> str:
    return lab_server_config(workdir, PROFILES, 1) + """
c.JupyterHub.allow_named_servers = True
c.Culler.interval = 0.5
c.Culler.grace_period = 2
c.Culler.pressure_allocated_fraction = 0.0  # any GPU held: under pressure
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


def kernel_env(hub, name: str, token: str) -> dict[str, str]:
    """Start a kernel in ``name``'s server through its Jupyter API; the environment it runs with."""
    import requests

    r = requests.post(f"{hub.url}/user/{q(name)}/api/kernels", json={"name": "python3"},
                      headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]

    def process() -> int | None:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if f"kernel-{kernel}.json".encode() in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
        return None

    return proc_environ(wait_for(process, 30, f"kernel {kernel}'s process"))


def test_18_5_to_18_7_culled_user_sees_it_and_gets_no_gpu_again(notice_hub, browser_page):
    from playwright.sync_api import expect

    hub, page = notice_hub, browser_page
    hub.create_user("admin")
    hub.create_user("bob")
    admin, bob = hub.token_for("admin"), hub.token_for("bob")

    def set_balance(amount: str) -> None:
        me = hub.service("GET", "/me", alice).json()
        r = hub.service("POST", f"/users/{q('alice')}/grant", admin,
                        json={"amount": str(Decimal(amount) - Decimal(me["balance"])), "reason": "test"})
        assert r.status_code == 201, r.text

    server = spawn(hub, "alice", {"profile": "gpu"}, timeout=LAB_MS / 1000)
    alice = hub.token_for("alice")
    try:
        hub_login(page, hub.url, "alice")  # the hub's OAuth then lets her into her server
        page.goto(f"{hub.url}{server['url']}lab", wait_until="domcontentloaded")
        item = wait_for_status_item(page, timeout_ms=LAB_MS)
        assert kernel_env(hub, "alice", alice)["CUDA_VISIBLE_DEVICES"]  # her GPU, while she holds it
        # bob holds a GPU too (an allocation, no server): the pool stays under pressure after the
        # cull frees alice's GPU, so her warning stands, carried out, until she is topped up
        r = hub.service("POST", "/allocations", hub.spawner_token, json={"user": "bob", "request": {"gpus": 1}})
        assert r.status_code == 201, r.text
        # below zero under pressure: warned, then (grace 2 s) her kernels are shut down, GPUs taken back
        set_balance("-1")
        [n] = wait_for(lambda: hub.service("GET", "/me", alice).json()["notices"], timeout=30,
                       what="alice's notice of the cull")
        assert n["kind"] == "kernels_stopped" and n["server"] == ""
        # 18.6: the widget says the kernels were stopped (no "kernels stop in 0:00"), and shows the notice
        expect(item).to_contain_text("\u26a0 kernels stopped", timeout=15_000)
        expect(item).to_contain_text("1 notice")
        expect(item).not_to_contain_text("0:00")
        panel = open_panel(page)
        expect(panel.locator("[data-gpupool='cull']")).to_contain_text("notebooks and files are untouched")
        box = panel.locator(f"[data-notice='{n['id']}']")
        expect(box).to_contain_text("Your kernels were stopped and their GPUs taken back")
        expect(box).to_contain_text("notebooks and files are untouched")
        assert hub.service("GET", "/me", bob).json()["notices"] == []
        box.locator("[data-gpupool='dismiss']").click()
        expect(panel.locator("[data-gpupool='notices']")).to_have_count(0, timeout=15_000)
        expect(item).not_to_contain_text("notice")
        assert hub.service("GET", "/me", alice).json()["notices"] == []
        # 18.7: the pressure is gone (she is topped up), but a new kernel in this server gets no GPU
        set_balance("50")
        expect(item).not_to_contain_text("kernels stopped", timeout=15_000)
        env = kernel_env(hub, "alice", alice)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "none"
        assert "took this server's GPUs back" in env["GPUPOOL_GPUS_REVOKED"]
    except Exception:
        print("--- browser console ---\n" + "\n".join(getattr(page, "gpupool_console", [])))
        print(f"--- hub log ---\n{hub.log_tail(60)}")
        raise
