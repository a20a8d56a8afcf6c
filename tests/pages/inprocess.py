"""The service's pages in-process: the real app (``make_app``) with a real
``HubOAuth`` whose only stand-in part is the hub's answer to "whose token is this".

Logging in sets a cookie holding a made-up token; ``StubOAuth`` maps it to a
user model. Everything else is JupyterHub's own code: the cookie and
``Authorization`` paths of ``HubAuth.get_user``, the XSRF token derived from
the login, the XSRF check on form posts, and the 403 of ``check_hub_user``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from html import unescape
from typing import Any
from urllib.parse import urlencode

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpupool_hub.service.common.context import ServiceContext
from gpupool_hub.service.webapp import make_app

PREFIX = "/services/gpupool/"
ADMIN_SCOPE = "custom:gpupool:admin"
ACCESS = "access:services!service=gpupool"
LOGIN_COOKIE = "stub-login"


def user_model(name: str, *, admin: bool = False, groups: tuple[str, ...] = ()) -> dict[str, Any]:
    scopes = [ACCESS, f"read:users:name!user={name}"] + ([ADMIN_SCOPE] if admin else [])
    return {"kind": "user", "name": name, "groups": list(groups), "scopes": scopes}


class StubOAuth(HubOAuth):
    """HubOAuth with the hub's token lookup replaced by a dict (token → model)."""

    def __init__(self, models: dict[str, dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(api_token="service-token", oauth_client_id="service-gpupool",
                         api_url="http://127.0.0.1:9/hub/api", base_url=PREFIX, access_scopes={ACCESS}, **kwargs)
        self.models = models

    def _get_token_cookie(self, handler: Any) -> str | None:
        return handler.get_cookie(LOGIN_COOKIE)

    def user_for_token(self, token: str, use_cache: bool = True, session_id: str = "", *, sync: bool = True) -> Any:
        model = self.models.get(token)

        async def answer() -> dict[str, Any] | None:
            return dict(model) if model else None

        return model if sync else answer()


class PagesService:
    """The app on a loopback port; ``get``/``post`` as a browser of one logged-in user."""

    def __init__(self, manager: Any, models: dict[str, dict[str, Any]], **context: Any) -> None:
        self.manager = manager
        self.auth = StubOAuth(models)
        self.context = ServiceContext(manager=manager, hub_auth=None, prefix=PREFIX, admin_scope=ADMIN_SCOPE,
                                      page_auth=self.auth, **context)
        self.app = make_app(self.context)
        sock, self.port = bind_unused_port()
        self.server = HTTPServer(self.app)
        self.server.add_sockets([sock])
        self.origin = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def client(self, token: str | None) -> Browser:
        return Browser(self, token)


class Browser:
    """Cookies of one browser: the login cookie plus whatever the service sets (``_xsrf``)."""

    def __init__(self, service: PagesService, token: str | None) -> None:
        self.service = service
        self.cookies: dict[str, str] = {LOGIN_COOKIE: token} if token else {}

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Sec-Fetch-Mode": "navigate", "User-Agent": "pages-test"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        headers.update(extra or {})
        return headers

    def _keep(self, resp: HTTPResponse) -> None:
        for header in resp.headers.get_list("Set-Cookie"):
            name, _, rest = header.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]

    async def get(self, path: str, headers: dict[str, str] | None = None) -> HTTPResponse:
        resp = await AsyncHTTPClient().fetch(self.service.origin + PREFIX + path, headers=self._headers(headers),
                                             follow_redirects=False, raise_error=False)
        self._keep(resp)
        return resp

    async def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> HTTPResponse:
        extra = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
        resp = await AsyncHTTPClient().fetch(self.service.origin + PREFIX + path, method="POST",
                                             body=urlencode(form), headers=self._headers(extra),
                                             follow_redirects=False, raise_error=False)
        self._keep(resp)
        return resp


def field(html: str, name: str) -> str:
    """The value of a form field in a page."""
    m = re.search(rf'name="{re.escape(name)}"[^>]*value="([^"]*)"', html) or \
        re.search(rf'value="([^"]*)"[^>]*name="{re.escape(name)}"', html)
    assert m, f"no field {name!r} in the page"
    return unescape(m.group(1))


def attrs(html: str, selector_attr: str) -> list[dict[str, str]]:
    """Every element carrying ``selector_attr`` (e.g. ``data-gpupool="gpu"``), as attribute dicts."""
    out = []
    for m in re.finditer(r"<(\w+)\s([^>]*?%s[^>]*)>" % re.escape(selector_attr), html):
        out.append({k: unescape(v) for k, v in re.findall(r'([\w:-]+)="([^"]*)"', m.group(2))})
    return out


@asynccontextmanager
async def chromium_on(service: PagesService) -> AsyncIterator[Callable[[str], Awaitable[Any]]]:
    """Headless Chromium in front of the in-process service (async Playwright: the service
    runs on the test's own loop). Yields ``open_as(token)``: a new page whose browser holds
    that user's login cookie. Skips where Playwright or Chromium is missing."""
    pytest.importorskip("playwright.async_api", reason="the playwright package is not installed")
    from playwright.async_api import async_playwright

    from tests.labext.browser import CHROMIUM_ARGS, find_chromium

    path = find_chromium()
    if not path:
        pytest.skip("Chromium not found; apt-get install chromium")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)

        async def open_as(token: str) -> Any:
            context = await browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC",
                                                locale="en-US")
            await context.add_cookies([{"name": LOGIN_COOKIE, "value": token, "url": service.origin}])
            return await context.new_page()

        try:
            yield open_as
        finally:
            await browser.close()
