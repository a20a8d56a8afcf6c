"""The pages while the ledger's PostgreSQL is down (issue 37, point 2): every page that
needs the database answers 503 with ``Retry-After`` and a readable page, the log gets
one warning line per request (no traceback), and the pages work again once it is back.

The real app (``make_app``) over a real PostgreSQL server of the test's own, which the
test stops (``pg_ctl stop -m immediate``, as a crash or an admin would) and starts again;
the hub's login is stood in (``inprocess.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from decimal import Decimal

import pytest

from gpupool_hub.ledger import Posting
from tests.fixtures.manager import make_manager

from .inprocess import PagesService, field, user_model

pytestmark = pytest.mark.integration

A6000 = "NVIDIA RTX A6000"
NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": A6000}}]
MODELS = {"alice-token": user_model("alice"), "admin-token": user_model("admin", admin=True)}

#: every page that reads the ledger: (who, path)
READING_PAGES = [
    ("alice", ""),  # My GPU usage
    ("alice", "?days=90"),
    ("alice", "me/history.csv"),
    ("admin", "admin/pool"),
    ("admin", "admin/accounts"),
    ("admin", "admin/users/alice"),
    ("admin", "admin/users/alice/history.csv"),
    ("admin", "admin/teams"),
    ("admin", "admin/idle"),
    ("admin", "admin/audit"),
]
#: the forms: their pages need nothing from the database, their submissions do
FORM_PAGES = ["admin/grant", "admin/ledger"]


@pytest.fixture
async def service(stoppable_postgres):
    # with teams, the teams page reads every allocation from the ledger
    manager = make_manager(NODES, {"RTX A6000": 4}, stoppable_postgres.url + "/gpupool", teams={"vision": {"gpus": 2}})
    manager.accounts.ensure("alice")
    manager.ledger.post(Posting("alice", "debit", Decimal("-2"), "seed-debit", model=A6000), now=manager.clock())
    s = PagesService(manager, MODELS)
    yield s
    s.stop()
    manager.ledger.close()


async def _answers(service, browsers):
    return {(who, path): await browsers[who].get(path) for who, path in READING_PAGES + [
        ("admin", p) for p in FORM_PAGES]}


async def test_every_page_answers_503_with_retry_after_while_postgres_is_down_and_200_after(
        service, stoppable_postgres, caplog):
    browsers = {"alice": service.client("alice-token"), "admin": service.client("admin-token")}
    for (who, path), r in (await _answers(service, browsers)).items():
        assert r.code == 200, (who, path, r.code, r.body.decode()[-300:])
    grant_page = (await browsers["admin"].get("admin/grant")).body.decode()
    grant = {"user": "alice", "amount": "5", "reason": "while the database is away",
             "key": field(grant_page, "key"), "_xsrf": field(grant_page, "_xsrf")}
    verify = {"_xsrf": field(grant_page, "_xsrf")}

    stoppable_postgres.stop()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        try:
            down = {(who, path): await browsers[who].get(path) for who, path in READING_PAGES}
            down[("admin", "POST admin/grant")] = await browsers["admin"].post("admin/grant", grant)
            down[("admin", "POST admin/ledger")] = await browsers["admin"].post("admin/ledger", verify)
            forms = {path: await browsers["admin"].get(path) for path in FORM_PAGES}
        finally:
            stoppable_postgres.start()
    for what, r in down.items():
        body = r.body.decode()
        assert r.code == 503, (what, r.code, body[-500:])
        assert int(r.headers["Retry-After"]) >= 1, what
        assert r.headers["Content-Type"].startswith("text/html"), what
        assert 'data-gpupool="error" data-status="503"' in body, what
        assert "The ledger database cannot be reached; nothing was changed." in body, what
        assert "Traceback" not in body and "psycopg" not in body and "OperationalError" not in body, what
        assert r.headers["Content-Security-Policy"].startswith("default-src 'self'"), what
    for path, r in forms.items():  # an empty form needs no database; submitting it does (above)
        assert r.code == 200, path
    # the log: one warning line per refused request, no ERROR and no traceback (the access log's
    # own line per request aside: in the service that is GPUPoolService._log_request's)
    records = [rec for rec in caplog.records if rec.name.startswith(("gpupool", "tornado"))
               and rec.name != "tornado.access"]
    assert not [rec for rec in records if rec.levelno >= logging.ERROR], \
        [rec.getMessage()[:200] for rec in records if rec.levelno >= logging.ERROR]
    assert not [rec for rec in records if rec.exc_info], "a traceback in the log"
    warnings = [rec.getMessage() for rec in records if rec.levelno == logging.WARNING
                and "Database unreachable" in rec.getMessage()]
    assert len(warnings) == len(down), warnings
    assert all("\n" not in w for w in warnings)
    assert any(w.startswith("Database unreachable, answered 503: GET /services/gpupool/: ") for w in warnings)

    # back: every page answers again (pooled connections to the old server are replaced), and the
    # grant refused while the database was down was not half-recorded: the same form grants once
    deadline = time.monotonic() + 60
    while True:
        answers = await _answers(service, browsers)
        if all(r.code == 200 for r in answers.values()):
            break
        assert time.monotonic() < deadline, {k: r.code for k, r in answers.items() if r.code != 200}
        await asyncio.sleep(0.2)
    r = await browsers["admin"].post("admin/grant", grant)
    assert r.code == 201, r.body.decode()[-500:]
    assert (await browsers["admin"].post("admin/ledger", verify)).code == 200
    reasons = [e.reason for e in service.manager.ledger.history("alice")]
    assert reasons.count("while the database is away") == 1
