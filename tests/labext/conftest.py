"""Fixtures for the balance widget's tests (see browser.py, servers.py, standin.py)."""

from .browser import browser_page, chromium_executable  # noqa: F401 (fixtures)
