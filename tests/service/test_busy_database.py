"""A ledger write that cannot get the database in time is a 503 with Retry-After, never a 500.

In-process service (``make_app`` over a real SQLite ledger, a stub token
checker); another connection holds SQLite's write lock, and the service's
connections give up after 50 ms instead of the production 30 s.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
import sqlalchemy as sa
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpupool_hub.ledger import LedgerBusy, is_database_busy
from gpupool_hub.service.common.context import ServiceContext
from gpupool_hub.service.webapp import make_app
from tests.fixtures.manager import make_manager

PREFIX = "/services/gpupool/"
ADMIN = "custom:gpupool:admin"
NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": "NVIDIA A100"}}]


class StubHubAuth:
    async def user_for_token(self, token, sync=False):
        return {"admin-token": {"kind": "user", "name": "ada", "scopes": [ADMIN]}}.get(token)


@pytest.fixture
async def service(tmp_path):
    path = tmp_path / "ledger.sqlite"
    manager = make_manager(NODES, {"A100": 2}, f"sqlite:///{path}")
    manager.ledger.open_account("bob")

    @sa.event.listens_for(manager.ledger.db.engine, "connect")
    def _impatient(dbapi_conn, _record):  # after the ledger's own PRAGMA busy_timeout=30000
        dbapi_conn.execute("PRAGMA busy_timeout=50")

    manager.ledger.db.engine.dispose()
    sock, port = bind_unused_port()
    server = HTTPServer(make_app(ServiceContext(manager=manager, hub_auth=StubHubAuth(), prefix=PREFIX,
                                                admin_scope=ADMIN)))
    server.add_sockets([sock])
    server.db_path = path
    server.url = f"http://127.0.0.1:{port}{PREFIX}api/v1/"
    yield server
    server.stop()


async def test_12_a_locked_database_is_503_with_retry_after(service):
    locker = sqlite3.connect(service.db_path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another process writing, for longer than the service waits
    try:
        resp = await AsyncHTTPClient().fetch(
            service.url + "users/bob/grant", method="POST", raise_error=False,
            headers={"Authorization": "token admin-token"}, body=json.dumps({"amount": "5", "reason": "busy"}))
    finally:
        locker.rollback()
        locker.close()
    assert resp.code == 503, resp.body
    assert int(resp.headers["Retry-After"]) >= 1  # seconds; the writer's bound suggests how long
    body = json.loads(resp.body)
    assert body["status"] == 503 and "busy" in body["message"] and "try again" in body["message"]
    # with the lock gone the same grant goes through
    resp = await AsyncHTTPClient().fetch(
        service.url + "users/bob/grant", method="POST", raise_error=False,
        headers={"Authorization": "token admin-token"}, body=json.dumps({"amount": "5", "reason": "busy"}))
    assert resp.code == 201, resp.body


class _PgError(Exception):
    def __init__(self, sqlstate):
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize("exc, busy", [
    (sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), True),
    (sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is busy")), True),
    (sa.exc.OperationalError("UPDATE", {}, _PgError("55P03")), True),  # lock_not_available
    (sa.exc.OperationalError("UPDATE", {}, _PgError("57014")), True),  # lock_timeout / statement_timeout
    (sa.exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"), True),
    (LedgerBusy("no connection within 5 s"), True),
    (sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: gpupool_entries")), False),
    (sa.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")), False),
    (RuntimeError("database is locked"), False),  # only database errors say so
])
def test_12_which_database_errors_mean_busy(exc, busy):
    assert is_database_busy(exc) is busy
