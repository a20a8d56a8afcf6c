"""Fixtures for the pages in a real hub: one hub per module, one Chromium per module.

``pages_hub`` is the hub from ``jupyterhub_config.example.py`` (the demo's
three simulated nodes) with per-run ports and paths (``ExampleHub``), a short
debit interval so debits appear while the tests run, and a long reconcile
grace so allocations the tests make through the API (no real server behind
them) are not released under them. Before it starts, alice's ledger gets 30
days of history, written through ``Ledger.post`` into the service's database.

``chromium`` is one headless Debian Chromium (``executable_path``); each test
opens its own browser contexts (one per logged-in user).

Screenshots go to ``build/screenshots/pages/`` (git-ignored); running the
suite changes no tracked file. ``scripts/update-screenshots.sh`` copies them
into ``docs/images/``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ExampleHub, shut_down
from tests.fixtures.hub import require_hub_binaries
from tests.labext.browser import CHROMIUM_ARGS, find_chromium

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "build" / "screenshots" / "pages"
A6000 = "NVIDIA RTX A6000"
RTX2080 = "NVIDIA GeForce RTX 2080"
RTX3090 = "NVIDIA GeForce RTX 3090"
PRICES = {A6000: Decimal(4), RTX3090: Decimal(1), RTX2080: Decimal("0.5")}  # the example config's


class PagesHub(ExampleHub):
    """The example hub, plus: allocations made through the API outlive the reconcile job."""

    def write_config(self) -> None:
        super().write_config()
        with open(self.config_path, "a") as f:
            f.write(textwrap.dedent("""
            # allocations made by the tests through the API have no server behind them
            c.GPUPoolService.reconcile_grace = 3600
            """))


def seed_history(db_url: str, user: str, now: datetime) -> list[dict[str, Any]]:
    """30 days of credits and GPU debits for ``user``: what a month of use leaves in the ledger.

    The account's scheduled credits are marked applied through today (as the
    service would have done), so the service adds nothing of its own at start.
    Returns the entries (time, signed amount) so tests can recompute a day's balance."""
    from gpupool_hub.ledger import Ledger, Posting

    ledger = Ledger(db_url)
    posted = []
    start = (now - timedelta(days=29)).replace(hour=0, minute=5, second=0, microsecond=0)
    posts = [(start, Posting(user, "grant", Decimal(100), "seed:initial", reason="initial grant"))]
    for day in range(1, 30):
        at = min(start + timedelta(days=day), now)
        posts.append((at, Posting(user, "daily", Decimal(1), f"seed:daily:{day}", reason="daily credit")))
        weekday = at.weekday()
        if weekday >= 5 or day == 29:  # weekends off; today's usage is the test's own
            continue
        usage = [(13, RTX3090, 2)] + ([(9, A6000, 1)] if weekday in (0, 2) else []) + \
            ([(15, RTX2080, 2)] if weekday == 4 else [])
        for hour, model, gpus in usage:
            t0 = at.replace(hour=hour, minute=0)
            cost = PRICES[model] * gpus
            posts.append((t0 + timedelta(hours=1, minutes=1), Posting(
                user, "debit", -cost, f"seed:debit:{day}:{hour}", reason=f"{gpus} GPU-h of {model}", model=model,
                interval_start=t0, interval_end=t0 + timedelta(hours=1), gpu_seconds=Decimal(3600 * gpus))))
    for at, posting in posts:
        ledger.post(posting, now=at)
        posted.append({"at": at, "amount": posting.amount})
    ledger.post_credits(user, [], through=now.date(), now=now)
    ledger.close()
    return posted


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    path = find_chromium()
    if not path:
        pytest.skip("Chromium not found; apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def pages_hub(chromium, tmp_path_factory) -> Iterator[PagesHub]:
    # chromium first: skip before starting anything when there is no browser
    require_hub_binaries()
    workdir = tmp_path_factory.mktemp("pageshub")
    hub = PagesHub(workdir, debit_interval=5, debit_check_interval=1)
    hub.seeded = seed_history(f"sqlite:///{workdir}/gpupool.sqlite", "alice", datetime.now(timezone.utc))
    hub.start()
    try:
        for name in ("alice", "bob", "admin"):
            hub.create_user(name)
        hub.tokens = {name: hub.token_for(name) for name in ("alice", "bob", "admin")}
        yield hub
    finally:
        shut_down(hub)


def new_page(browser: Any, *, width: int = 1280, height: int = 900, scheme: str = "light") -> Any:
    """A fresh context (its own cookies: one logged-in user) and page."""
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme,
                                  timezone_id="UTC", locale="en-US", accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(f"pageerror: {err}"))
    page.gpupool_errors = errors
    return page


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    return path
