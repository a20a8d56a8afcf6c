"""The service's web pages: "My GPU usage" for every user, admin pages for admins.

========================== ============================================ =========
``{prefix}``               My GPU usage (own data only)                 user
``{prefix}me/history.csv`` own entries as CSV                           user
``{prefix}me/notices``     POST: dismiss one of one's own notices       user
``{prefix}admin/pool``     pool map: GPUs by holder; per model if large  admin
``{prefix}admin/accounts`` accounts: search, sort, negative filter      admin
``{prefix}admin/users/…``  any user's usage page and CSV                admin
``{prefix}admin/grant``    grant form (idempotent per render)           admin
``{prefix}admin/teams``    team usage against quota                     admin
``{prefix}admin/audit``    the audit log                                admin
``{prefix}admin/ledger``   verify the ledger                            admin
``{prefix}oauth_callback`` hub OAuth callback                           —
``{prefix}static/…``       the stylesheet                               —
========================== ============================================ =========

Handlers live in ``usage.py``, ``admin.py`` and ``poolmap.py``, login and page plumbing in
``base.py``, chart geometry in ``charts.py`` (pure), and the read-only queries
the charts need in the ledger's ``reports`` store (``ledger/reports.py``). See docs/pages.md.
"""

from __future__ import annotations

from importlib import resources

from .admin import (
    AccountsHandler,
    AdminIndexHandler,
    AuditHandler,
    GrantHandler,
    IdleHoursHandler,
    LedgerHandler,
    TeamsHandler,
)
from .base import NotFoundHandler, OAuthCallbackHandler, StaticHandler
from .poolmap import PoolMapHandler
from .usage import (
    MyHistoryCSVHandler,
    MyNoticeDismissHandler,
    MyUsageHandler,
    UserHistoryCSVHandler,
    UserUsageHandler,
)

STATIC_DIR = str(resources.files(__package__).joinpath("static"))


def page_routes(prefix: str) -> list[tuple]:  # type: ignore[type-arg]
    """Routes to append to the API's (:func:`gpupool_hub.service.api.routes`)."""
    p = prefix.rstrip("/")
    name = r"([^/]+)"
    return [
        (rf"{p}/", MyUsageHandler),
        (rf"{p}/me/history\.csv", MyHistoryCSVHandler),
        (rf"{p}/me/notices", MyNoticeDismissHandler),
        (rf"{p}/oauth_callback", OAuthCallbackHandler),
        (rf"{p}/static/(.*)", StaticHandler, {"path": STATIC_DIR}),
        (rf"{p}/admin/?", AdminIndexHandler),
        (rf"{p}/admin/pool", PoolMapHandler),
        (rf"{p}/admin/accounts", AccountsHandler),
        (rf"{p}/admin/users/{name}/history\.csv", UserHistoryCSVHandler),
        (rf"{p}/admin/users/{name}", UserUsageHandler),
        (rf"{p}/admin/grant", GrantHandler),
        (rf"{p}/admin/teams", TeamsHandler),
        (rf"{p}/admin/idle", IdleHoursHandler),
        (rf"{p}/admin/audit", AuditHandler),
        (rf"{p}/admin/ledger", LedgerHandler),
        (rf"{p}/(?!api/).*", NotFoundHandler),  # last: unknown pages get a page, unknown API paths stay JSON-less 404s
    ]
