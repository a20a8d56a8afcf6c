"""The base of every page: hub OAuth login, one authorisation check, XSRF, CSP, templates.

Pages log in the way JupyterHub services do: ``HubOAuthenticated`` redirects
an unknown browser to the hub's OAuth authorize URL, and
``HubOAuthCallbackHandler`` (at ``{prefix}oauth_callback``) stores the
resulting token in a cookie. The token's scopes decide what a page shows; the
one place that decides it is :meth:`PageHandler.check_hub_user`.

The JSON API (``handlers.py``) is separate: it honours only ``Authorization``
tokens, never cookies, so it needs no XSRF protection. Pages accept cookies,
so every form carries ``_xsrf`` (``xsrf_form_html``) and every unsafe request
is checked here, with JupyterHub's XSRF rules (``HubOAuth.check_xsrf_cookie``).
The check lives in the page handlers rather than in the application's
``xsrf_cookies`` setting so that it cannot reach the API routes. Unsafe requests
sent by a browser from another site are refused before that, whatever their
``_xsrf`` (:func:`foreign_origin`): a leaked token alone does not make a form.

While the ledger database is busy or down, a page answers 503 with ``Retry-After``
and says so in words, as the API does (``api.base.database_trouble`` decides for both).
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import datetime
from decimal import Decimal
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from markupsafe import Markup
from tornado import web
from tornado.httputil import HTTPServerRequest

from ..common.context import ServiceContext
from ..api.base import BUSY_RETRY_AFTER, LogsDatabaseTrouble, database_trouble
from ..api.httpargs import QueryArgs
from ..common.hubapi import HubError
from ..core.manager import PoolManager
from ..core.threads import share_write_deadline
from ...timefmt import WHEN_FORMAT, time_html
from ...money.units import MINUS, amount_text, balance_text

log = logging.getLogger("gpupool.pages")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: No inline script or style anywhere: every value on a page is data, never code.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'")


#: what a page says when the ledger database cannot answer (the status is 503 either way)
DATABASE_BUSY = "The ledger database is busy; nothing was changed. Reload the page in a few seconds."
DATABASE_AWAY = ("The ledger database cannot be reached; nothing was changed. Reload the page in a few "
                 "seconds; if this goes on, tell the pool's admins.")


def _static_version() -> str:
    """A hash of the stylesheet and the script, so browsers fetch new ones after an upgrade."""
    static = resources.files(__package__).joinpath("static")
    data = b"".join(static.joinpath(name).read_bytes() for name in ("pages.css", "localtime.js"))
    return hashlib.sha256(data).hexdigest()[:12]


#: amounts and balances read as everywhere else (units.py: the spawn form, the widget's precision)
tokens = amount_text
balance = balance_text


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``netloc`` as a browser at ``scheme`` reaches it, or None if unreadable."""
    try:
        parts = urlsplit(f"//{netloc.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def own_hosts(request: HTTPServerRequest) -> list[str]:
    """The ``host[:port]`` names the browser may have used for this page: the ``Host`` header,
    and the outermost host a proxy in front of the hub reports (``X-Forwarded-Host``,
    ``Forwarded: host=``), as Jupyter Server's ``check_origin`` and JupyterHub's former
    ``check_referer`` (with ``forwarded_host_header``) read them. A page on another site
    cannot set these on a form, nor on a script's request without a CORS preflight, which
    the pages never grant."""
    hosts = [request.headers.get("Host", "")]
    hosts.append(request.headers.get("X-Forwarded-Host", "").split(",", 1)[0])
    first = request.headers.get("Forwarded", "").split(",", 1)[0]
    for pair in first.split(";"):
        key, _, value = pair.partition("=")
        if key.strip().lower() == "host":
            hosts.append(value.strip().strip('"'))
    return [h.strip() for h in hosts if h.strip()]


def foreign_origin(request: HTTPServerRequest) -> str | None:
    """Why an unsafe request came from a page of another origin (the header that says so), or
    None. A browser sends ``Sec-Fetch-Site`` and ``Origin`` on every form and script request;
    the pages' own forms are same-origin, so anything else (another site, a sibling host such
    as a user's server on a subdomain, a sandboxed ``null`` origin) is refused. Requests with
    neither header (command-line tools) pass on to the ``_xsrf`` check as before. Host and
    port are compared, not the scheme, which a TLS-terminating proxy may hide."""
    site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    parts = urlsplit(origin.strip())
    theirs = _host_port(parts.netloc, parts.scheme.lower()) if parts.scheme and parts.netloc else None
    ours = {_host_port(host, parts.scheme.lower()) for host in own_hosts(request)}
    if theirs is None or theirs not in ours:
        return f"Origin: {origin[:200]}"
    return None


ENV = Environment(
    loader=PackageLoader("gpupool_hub.service.pages", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
    auto_reload=False,  # the templates ship with the package: no file check on every page (~1 ms each)
)
ENV.filters["tokens"] = tokens
ENV.filters["balance"] = balance
ENV.filters["q"] = lambda value: quote(str(value), safe="")  # a name as one URL path segment or query value
STATIC_VERSION = _static_version()


class PageHandler(LogsDatabaseTrouble, HubOAuthenticated, QueryArgs):
    """A page of the service. Subclasses set ``admin_only`` and implement ``get``/``post``."""

    trouble_log = log
    blank_is_missing = True  # forms submit empty fields
    #: Admin pages need the admin scope (``ServiceContext.admin_scope``) in the OAuth token.
    admin_only = False
    #: Pages about "my" data need a user (not a service) token.
    users_only = False
    title = "gpupool"

    @property
    def context(self) -> ServiceContext:
        return self.settings["context"]

    @property
    def manager(self) -> PoolManager:
        return self.context.manager

    @property  # type: ignore[override]
    def hub_auth(self) -> Any:
        """The service's ``HubOAuth`` (one per service, built in ``GPUPoolService``)."""
        return self.context.page_auth

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("Cache-Control", "no-store")  # personal data: never from a shared cache

    # ------------------------------------------------------------ access

    def check_hub_user(self, model: dict[str, Any]) -> dict[str, Any]:
        """The one authorisation decision of the pages.

        JupyterHub's check first (the token may access this service at all),
        then: admin pages need the admin scope, "my" pages need a user."""
        model = super().check_hub_user(model)
        if self.admin_only and self.context.admin_scope not in set(model.get("scopes", [])):
            raise UserNotAllowed(model)
        if self.users_only and model.get("kind", "user") != "user":
            raise UserNotAllowed(model)
        return model

    def forbidden_message(self, model: dict[str, Any]) -> str:
        if self.admin_only:
            return (f"This page is for gpupool admins: it needs the {self.context.admin_scope!r} scope, "
                    f"which {model.get('name')!r} does not have in this login.")
        if self.users_only:
            return "This page shows a user's own usage; log in as a user."
        return f"{model.get('kind', 'user')} {model.get('name')!r} may not use the gpupool service."

    async def prepare(self) -> None:
        self._started = time.perf_counter()
        share_write_deadline()  # the core writes this request awaits give up together
        if self.hub_auth is None:
            raise web.HTTPError(503, "The gpupool pages need hub OAuth: run the service as a hub service with a URL.")
        if self.request.method not in SAFE_METHODS:
            self.check_same_origin()
        model = await self.hub_auth.get_user(self, sync=False)
        if model:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                raise web.HTTPError(403, self.forbidden_message(model)) from None
        self._hub_auth_user_cache = model
        self.current_user = model
        if model is None:
            if self.request.method in ("GET", "HEAD"):
                self.redirect(self.get_login_url())
                return
            # cookie login without a matching _xsrf field is dropped by HubOAuth: say why
            raise web.HTTPError(403, "This form could not be verified (missing or stale _xsrf). "
                                     "Reload the page and submit it again.")
        if self.request.method not in SAFE_METHODS:
            self.check_xsrf_cookie()

    def check_same_origin(self) -> None:
        """Refuse (403) an unsafe request a browser sent from a page of another origin."""
        why = foreign_origin(self.request)
        if why is None:
            return
        log.warning("Refused a cross-origin %s %s (%s; Host: %s)", self.request.method, self.request.path, why,
                    ", ".join(own_hosts(self.request)) or "none")
        raise web.HTTPError(403, f"This form was sent from another site ({why}); the gpupool pages take forms "
                                 f"only from their own pages, so nothing was changed.")

    @property
    def user(self) -> dict[str, Any]:
        return self.current_user  # type: ignore[return-value]

    @property
    def is_admin(self) -> bool:
        return self.context.admin_scope in set((self.current_user or {}).get("scopes", []))

    async def groups_of(self, name: str) -> list[str]:
        """A user's hub groups: from their own login when it is them, else from the hub."""
        me = self.current_user or {}
        if me.get("name") == name and me.get("kind", "user") == "user" and "groups" in me:
            return list(me["groups"])
        if self.context.groups is None:
            return []
        return await self.context.groups(name)

    # ------------------------------------------------------------ output

    @property
    def hub_home(self) -> str:
        return f"{getattr(self.hub_auth, 'hub_prefix', None) or '/hub/'}home"

    def url(self, path: str = "") -> str:
        return self.context.prefix + path.lstrip("/")

    def _namespace(self, logged_in: bool) -> dict[str, Any]:
        """What every template may use; error pages get no user (the error may be about them)."""
        user = self.current_user if logged_in else None
        return {
            "prefix": self.context.prefix,
            "url": self.url,
            "static": lambda name: f"{self.context.prefix}static/{name}?v={STATIC_VERSION}",
            "me": user,
            "is_admin": self.is_admin if user else False,
            "xsrf_form_html": Markup(self.xsrf_form_html()) if user else "",
            "title": self.title,
            "hub_home": self.hub_home,
            "request_path": self.request.path,
            "tz": self.manager.settings.tz,
        }

    def render_page(self, template: str, **values: Any) -> None:
        self.finish(ENV.get_template(template).render(**{**self._namespace(True), **values}))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """An error page; database trouble (busy, down) is 503 with ``Retry-After``, never a 500."""
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        trouble = database_trouble(exc)
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif trouble is not None:
            status_code = 503
            self.set_status(status_code)
            message = DATABASE_BUSY if trouble.busy else DATABASE_AWAY
        elif status_code >= 500:
            message = "Internal error in the gpupool service; see its log."
        if status_code == 503:  # the hub or the database is busy or away: worth a reload, soon
            self.set_header("Retry-After", str(BUSY_RETRY_AFTER if trouble is None else trouble.retry_after))
        self.set_allow_header(status_code)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(ENV.get_template("error.html").render(**{
            **self._namespace(False), "title": f"{status_code} {self._reason}", "status": status_code,
            "message": message}))

    async def known_user(self, name: str) -> bool:
        """Whether ``name`` has an account, or is a hub user (who may never have logged in)."""
        try:
            return await self.context.known_user(name)
        except HubError as e:
            raise web.HTTPError(503, f"Cannot reach JupyterHub to look up {name!r}: {e}") from None

    def on_finish(self) -> None:
        metrics = self.context.metrics
        if metrics is not None and hasattr(self, "_started"):
            metrics.api_latency.labels(type(self).__name__, self.request.method, str(self.get_status())).observe(
                time.perf_counter() - self._started)


class NotFoundHandler(PageHandler):
    """Any other path under the prefix (but the API's): a 404 page with the pages' headers."""

    async def prepare(self) -> None:
        raise web.HTTPError(404, "There is no gpupool page here.")


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """``{prefix}oauth_callback``: JupyterHub's handler with the service's ``HubOAuth``."""

    @property  # type: ignore[override]
    def hub_auth(self) -> Any:
        return self.settings["context"].page_auth

    async def prepare(self) -> None:
        if self.hub_auth is None:
            raise web.HTTPError(503, "hub OAuth is not configured for this service")


class StaticHandler(web.StaticFileHandler):
    """The pages' stylesheet; versioned URLs may be cached for long."""

    def set_extra_headers(self, path: str) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        if self.get_query_argument("v", None):
            self.set_header("Cache-Control", "public, max-age=31536000, immutable")


def local(value: datetime | str | None, tz: Any, fmt: str = WHEN_FORMAT) -> str:
    """A time (or the API's ISO string) as pages print it: :func:`~gpupool_hub.timefmt.time_html`, in the
    pool's zone until ``localtime.js`` (in base.html) puts it in the viewer's; seconds (the audit log) stay
    in the pool's zone, as plain text."""
    if value is None:
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if "%S" in fmt:
        return value.astimezone(tz).strftime(fmt)
    return time_html(value, tz, fmt)


ENV.filters["local"] = local
