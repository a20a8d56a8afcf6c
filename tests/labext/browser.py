"""Reusable browser helpers for the balance widget: headless Debian Chromium
driven by the Python ``playwright`` package (its driver ships in the wheel;
``playwright install`` is never run, the system Chromium is used).

Fixtures (imported by tests/labext/conftest.py):

* ``chromium_executable``: path of the system Chromium; skips when missing
  (CI turns that skip into a failure);
* ``browser_page``: a fresh persistent context (new user-data-dir) and page.

Helpers: :func:`launch_chromium`, :func:`open_lab` (token login),
:func:`hub_login` (JupyterHub's login form), :func:`write_lab_settings`,
:func:`wait_for_status_item`, :func:`status_item`, :func:`open_panel`,
:func:`screenshot_widget`.

They only assume a JupyterLab page with the status item: tests that start a
real hub and log in through it can reuse everything but :func:`open_lab`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Locator, Page

#: Where Debian's chromium package puts the browser.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

STATUS_ITEM = "[data-gpupool='status']"
PANEL = "[data-gpupool='panel']"

#: Generous: two shared cores, and JupyterLab loads ~10 MB of JavaScript.
LAB_TIMEOUT_MS = 90_000


def find_chromium() -> str | None:
    explicit = os.environ.get("GPUPOOL_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


@contextmanager
def launch_chromium(
    user_data_dir: Path, executable: str, *, viewport: dict[str, int] | None = None, timezone_id: str = "UTC"
) -> Iterator[BrowserContext]:
    """A headless Chromium with a fresh user-data-dir; yields its (only) context. ``timezone_id``: the
    zone the browser lives in (a test of local times picks one other than the pool's)."""
    from playwright.sync_api import sync_playwright

    user_data_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=viewport or {"width": 1280, "height": 800},
            timezone_id=timezone_id,
            locale="en-US",
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def chromium_executable() -> str:
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    path = find_chromium()
    if not path:
        pytest.skip(f"Chromium not found (looked for {', '.join(CHROMIUM_CANDIDATES)}); apt-get install chromium")
    return path


@pytest.fixture
def browser_page(chromium_executable: str, tmp_path: Path) -> Iterator[Page]:
    with launch_chromium(tmp_path / "chromium-profile", chromium_executable) as context:
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(LAB_TIMEOUT_MS)
        console: list[str] = []
        page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: console.append(f"pageerror: {err}"))
        page.gpupool_console = console  # type: ignore[attr-defined]
        yield page


def open_lab(page: Page, lab_url: str, token: str) -> None:
    """Log in with the server's token and open JupyterLab (``{lab_url}lab``)."""
    page.goto(f"{lab_url}lab?token={token}", wait_until="domcontentloaded")
    page.wait_for_selector("#jp-main-statusbar", timeout=LAB_TIMEOUT_MS)


def hub_login(page: Page, hub_url: str, name: str, password: str = "any") -> None:
    """Log in through JupyterHub's ``/hub/login`` form (DummyAuthenticator takes any password).

    Returns once the browser has left the login page (JupyterHub then goes on to
    the spawn page, or to the running server).
    """
    page.goto(f"{hub_url.rstrip('/')}/hub/login", wait_until="domcontentloaded")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    with page.expect_navigation(wait_until="domcontentloaded"):
        page.click("#login_submit")
    if "/hub/login" in page.url:
        raise AssertionError(f"login as {name!r} failed: still on {page.url}")


def write_lab_settings(settings_dir: Path, settings: dict[str, dict[str, Any]]) -> None:
    """Write JupyterLab user settings (``{plugin_id: values}``) into a
    ``JUPYTERLAB_SETTINGS_DIR``, e.g. ``{"@gpupool/hub-balance:plugin": {"pollInterval": 1}}``."""
    import json

    for plugin_id, values in settings.items():
        package, _, plugin = plugin_id.partition(":")
        target = settings_dir.joinpath(*package.split("/"), f"{plugin}.jupyterlab-settings")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))


def status_item(page: Page) -> Locator:
    return page.locator(STATUS_ITEM)


def wait_for_status_item(page: Page, text: str | None = None, *, timeout_ms: float = LAB_TIMEOUT_MS,
                         state: str | None = None) -> Locator:
    """Wait until the status item shows (``text`` in its text, ``state`` as its data-state)."""
    from playwright.sync_api import expect

    item = status_item(page)
    expect(item).to_be_visible(timeout=timeout_ms)
    if text is not None:
        expect(item).to_contain_text(text, timeout=timeout_ms)
    if state is not None:
        expect(item).to_have_attribute("data-state", state, timeout=timeout_ms)
    return item


def open_panel(page: Page) -> Locator:
    """Click the status item; returns the opened panel."""
    from playwright.sync_api import expect

    status_item(page).click()
    panel = page.locator(PANEL)
    expect(panel).to_be_visible()
    return panel


def screenshot_widget(page: Page, path: Path, *, margin: int = 24, **kwargs: Any) -> Path:
    """Save the bottom-left of the page: the status item and, if open, its panel."""
    boxes = [b for b in (status_item(page).bounding_box(), _box(page, PANEL)) if b]
    view = page.viewport_size or {"width": 1280, "height": 800}
    left = max(0, min(b["x"] for b in boxes) - margin)
    top = max(0, min(b["y"] for b in boxes) - margin)
    right = min(view["width"], max(b["x"] + b["width"] for b in boxes) + margin)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(path),
        clip={"x": left, "y": top, "width": right - left, "height": view["height"] - top},
        **kwargs,
    )
    return path


def _box(page: Page, selector: str) -> dict[str, float] | None:
    loc = page.locator(selector)
    return loc.bounding_box() if loc.count() else None
