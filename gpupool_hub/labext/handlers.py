"""``GET {base_url}gpupool/me``: the balance widget's data path (and ``DELETE
{base_url}gpupool/notices/{id}``, its dismiss button).

The single-user server forwards the request to the gpupool hub service's
``GET /services/gpupool/api/v1/me`` with its own ``JUPYTERHUB_API_TOKEN``
(``Authorization: token …``). The browser never sees that token and never
needs an OAuth round trip to the service; see docs/widget.md.

Where the service is:

1. ``GPUPOOL_API_URL`` (set by the spawner), e.g.
   ``http://127.0.0.1:8000/services/gpupool/api/v1/``;
2. else the hub is asked: ``GET {JUPYTERHUB_API_URL}/services/gpupool`` with the
   token; its ``url`` (the service's internal URL) plus its ``prefix``
   (``/services/gpupool/`` by default) plus ``api/v1/``;
3. else the answer is 503 ``{"error": "balance unavailable", "reason": …}``.

Every failure answers with that same JSON shape (503 when the service cannot
be located, 502 when it answered badly or not at all, 504 on a timeout) so
that the widget can show a quiet "balance unavailable" with the reason as a
tooltip.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import quote, urljoin

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .. import strictjson

#: Env var with the service's API base URL (ends in ``api/v1/``).
API_URL_ENV = "GPUPOOL_API_URL"
#: Env var with the service's name in the hub (default ``gpupool``).
SERVICE_NAME_ENV = "GPUPOOL_SERVICE_NAME"
#: Env var overriding the per-request timeout in seconds (default 5).
TIMEOUT_ENV = "GPUPOOL_API_TIMEOUT"

DEFAULT_SERVICE_NAME = "gpupool"
DEFAULT_TIMEOUT = 5.0
#: How long a service URL learnt from the hub is reused before asking again.
HUB_LOOKUP_TTL = 300.0

UNAVAILABLE = "balance unavailable"


class BalanceUnavailable(Exception):
    """The balance cannot be fetched; ``reason`` is shown to the user."""

    def __init__(self, reason: str, status: int = 503):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable ``name``; not a positive number: ``default``."""
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def _timeout() -> float:
    return env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def _token() -> str:
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not token:
        raise BalanceUnavailable("not running under JupyterHub (no JUPYTERHUB_API_TOKEN)")
    return token


def _ensure_slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


class ServiceLocator:
    """Finds the gpupool API base URL; caches what the hub said for a while."""

    def __init__(self) -> None:
        self._cached: tuple[str, float] | None = None

    def forget(self) -> None:
        self._cached = None

    async def api_url(self, client: AsyncHTTPClient, token: str) -> str:
        explicit = os.environ.get(API_URL_ENV, "").strip()
        if explicit:
            return _ensure_slash(explicit)
        if self._cached and self._cached[1] > time.monotonic():
            return self._cached[0]
        url = await self._ask_hub(client, token)
        self._cached = (url, time.monotonic() + HUB_LOOKUP_TTL)
        return url

    async def _ask_hub(self, client: AsyncHTTPClient, token: str) -> str:
        hub_api = os.environ.get("JUPYTERHUB_API_URL", "").strip()
        if not hub_api:
            raise BalanceUnavailable(
                f"gpupool service not configured ({API_URL_ENV} and JUPYTERHUB_API_URL unset)"
            )
        name = os.environ.get(SERVICE_NAME_ENV, "").strip() or DEFAULT_SERVICE_NAME
        lookup = url_path_join(hub_api, "services", name)
        timeout = _timeout()
        try:
            resp = await client.fetch(_json_request(lookup, token, timeout))
        except HTTPClientError as e:
            raise BalanceUnavailable(f"hub did not give the {name!r} service (HTTP {e.code})") from e
        except Exception as e:  # connection refused, DNS, timeout …
            raise BalanceUnavailable(f"hub unreachable: {e}") from e
        try:
            model = strictjson.loads(resp.body)
        except ValueError as e:
            raise BalanceUnavailable("hub answered with something that is not JSON") from e
        base = model.get("url") if isinstance(model, dict) else None
        if not base:
            raise BalanceUnavailable(
                f"hub gave no URL for the {name!r} service (token lacks read:services?)"
            )
        prefix = model.get("prefix") or f"/services/{name}/"
        return urljoin(_ensure_slash(base), _ensure_slash(prefix).lstrip("/") + "api/v1/")


def _json_request(url: str, token: str, timeout: float) -> HTTPRequest:
    """A GET for JSON with the server's hub token: how both the hub and the service are asked."""
    return HTTPRequest(
        url,
        headers={"Authorization": f"token {token}", "Accept": "application/json"},
        connect_timeout=timeout,
        request_timeout=timeout,
        follow_redirects=False,
    )


async def fetch_me(locator: ServiceLocator) -> dict[str, Any]:
    """The service's ``GET me`` with this server's token; ``BalanceUnavailable`` when it cannot."""
    token = _token()
    client = AsyncHTTPClient()
    api_url = await locator.api_url(client, token)
    url = urljoin(api_url, "me")
    timeout = _timeout()
    try:
        resp = await client.fetch(_json_request(url, token, timeout))
    except HTTPClientError as e:
        if e.code == 599:  # tornado's "no HTTP answer": timeout
            locator.forget()
            raise BalanceUnavailable("gpupool service timed out", 504) from e
        raise BalanceUnavailable(f"gpupool service answered HTTP {e.code}", 502) from e
    except Exception as e:  # connection refused, DNS, …
        locator.forget()
        raise BalanceUnavailable(f"gpupool service unreachable: {e}", 502) from e
    try:
        body = strictjson.loads(resp.body)
    except ValueError as e:
        raise BalanceUnavailable("gpupool service answered with something that is not JSON", 502) from e
    if not isinstance(body, dict) or "balance" not in body:
        raise BalanceUnavailable("gpupool service answered without a balance", 502)
    return body


class MeHandler(APIHandler):
    """``GET {base_url}gpupool/me`` → the service's ``GET me``, as is."""

    @property
    def locator(self) -> ServiceLocator:
        return self.settings.setdefault("gpupool_service_locator", ServiceLocator())

    def _unavailable(self, status: int, reason: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"error": UNAVAILABLE, "reason": reason}))

    @tornado.web.authenticated
    async def get(self) -> None:
        try:
            body = await self._fetch_me()
        except BalanceUnavailable as e:
            self.log.debug("gpupool balance unavailable: %s", e.reason)
            self._unavailable(e.status, e.reason)
            return
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    async def _fetch_me(self) -> dict[str, Any]:
        body = await fetch_me(self.locator)
        body["pages_url"] = pages_url()
        return body


class NoticeHandler(MeHandler):
    """``DELETE {base_url}gpupool/notices/{id}`` → the service's ``DELETE me/notices/{id}``:
    the widget's dismiss button. Answers 204, or the unavailable JSON (404 passed on)."""

    @tornado.web.authenticated
    async def delete(self, notice: str) -> None:
        try:
            token = _token()
            client = AsyncHTTPClient()
            url = urljoin(await self.locator.api_url(client, token), f"me/notices/{quote(notice, safe='')}")
            timeout = _timeout()
            request = HTTPRequest(url, method="DELETE", headers={"Authorization": f"token {token}"},
                                  connect_timeout=timeout, request_timeout=timeout, follow_redirects=False)
            try:
                await client.fetch(request)
            except HTTPClientError as e:
                raise BalanceUnavailable(f"gpupool service answered HTTP {e.code}", 404 if e.code == 404 else 502) from e
            except Exception as e:
                self.locator.forget()
                raise BalanceUnavailable(f"gpupool service unreachable: {e}", 502) from e
        except BalanceUnavailable as e:
            self._unavailable(e.status, e.reason)
            return
        self.set_status(204)
        self.finish()


def pages_url() -> str:
    """The public address of the service's "My GPU usage" page, from the hub's prefix."""
    base = _ensure_slash(os.environ.get("JUPYTERHUB_BASE_URL", "/") or "/")
    name = os.environ.get(SERVICE_NAME_ENV, "").strip() or DEFAULT_SERVICE_NAME
    return f"{base}services/{quote(name, safe='')}/"


def setup_handlers(web_app: Any) -> None:
    base_url = web_app.settings.get("base_url", "/")
    web_app.add_handlers(".*$", [(url_path_join(base_url, "gpupool", "me"), MeHandler),
                                 (url_path_join(base_url, "gpupool", "notices", "([0-9]+)"), NoticeHandler)])
